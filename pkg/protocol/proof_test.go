package protocol

import (
	"regexp"
	"testing"
)

// The vectors pin the wire format: a change here breaks every client.
func TestClusterProofVectors(t *testing.T) {
	const secret, sid = "c2VjcmV0LWZvci10ZXN0LXZlY3Rvci0wMDAwMDAwMDAwMDA", "Zr7Q2mWbX9kLp3Vt"
	proof := ClusterProof(secret, sid)
	if want := "-CdInllPAJ55U9RfMlDqAxw1duyyNKJG5-njsn67QXI"; proof != want {
		t.Fatalf("proof %q, want %q", proof, want)
	}
	if !VerifyClusterProof(secret, sid, proof) {
		t.Fatal("a proof does not verify")
	}
	for name, tc := range map[string][3]string{
		"other session": {secret, sid + "x", proof},
		"other secret":  {secret + "x", sid, proof},
		"empty secret":  {"", sid, ClusterProof("", sid)},
		"truncated":     {secret, sid, proof[:42]},
		"not base64":    {secret, sid, "!!" + proof[2:]},
		"empty":         {secret, sid, ""},
		// Found by FuzzVerifyClusterProof: base64 decoding skips line breaks.
		"line break": {secret, sid, proof[:42] + "\r" + proof[42:]},
	} {
		if VerifyClusterProof(tc[0], tc[1], tc[2]) {
			t.Errorf("%s: verified", name)
		}
	}
	code := ConfirmationCode(sid)
	if code != "IZ5L-N2QI" {
		t.Fatalf("code %q, want IZ5L-N2QI", code)
	}
	if !regexp.MustCompile(`^[A-Z2-7]{4}-[A-Z2-7]{4}$`).MatchString(code) {
		t.Fatalf("code %q: want XXXX-XXXX in base32", code)
	}
	if ConfirmationCode(sid+"x") == code {
		t.Fatal("two sessions share a code")
	}
	if ConfirmationCode(sid) != code {
		t.Fatal("the code is not deterministic")
	}
}

func FuzzVerifyClusterProof(f *testing.F) {
	f.Add("secret", "sid", "")
	f.Add("secret", "sid", ClusterProof("secret", "sid"))
	f.Fuzz(func(t *testing.T, secret, sid, proof string) {
		ok := VerifyClusterProof(secret, sid, proof)
		if ok && (secret == "" || proof != ClusterProof(secret, sid)) {
			t.Fatalf("verified a proof that is not the canonical one: %q", proof)
		}
	})
}
