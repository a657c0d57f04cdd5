package protocol

import (
	"net/url"
	"strings"
	"testing"
)

const vectorSecret = "c2VjcmV0LWZvci10ZXN0LXZlY3Rvci0wMDAwMDAwMDAwMDA"

// The test vectors of docs/protocol.md §4.
var vectors = []struct {
	name      string
	method    string
	url       string
	body      string
	canonical string
	sig       string
}{
	{"authorize", "GET", "https://bind.example.com/authorize?s=Zr7Q2mWbX9kLp3Vt&n=bm9uY2UtMDAwMQ",
		"", "n=bm9uY2UtMDAwMQ&s=Zr7Q2mWbX9kLp3Vt", "-1zVQpIURbjGv95fKorT7LMB8wWFO3reyEHskr3T2bI"},
	{"port, repeated and escaped parameters", "GET",
		"https://bind.example.com:8443/authorize?s=Zr7Q2mWbX9kLp3Vt&n=bm9uY2UtMDAwMg&tenant=acme+corp%2Fdev&a=2&a=1",
		"", "a=1&a=2&n=bm9uY2UtMDAwMg&s=Zr7Q2mWbX9kLp3Vt&tenant=acme%20corp%2Fdev", "oJ-uv-MMjrpIe1FHNUdSzmOvX9enfN8Kinc7W9mN1Dc"},
	{"poll", "GET", "https://bind.example.com/poll?s=Zr7Q2mWbX9kLp3Vt&n=bm9uY2UtMDAwMw",
		"", "n=bm9uY2UtMDAwMw&s=Zr7Q2mWbX9kLp3Vt", "N2lkgWRrNxlycLt521pz6CedKLKI0-tS75I2pVoaV6c"},
	{"post with body", "POST", "http://127.0.0.1:8080/x", `{"clusterID":"abc"}`,
		"", "lDsi8vuGmQrbh00mbH19LoOOZJFjg17Lp6nehVSn4_w"},
}

// request parses rawURL and makes the Request a server would verify.
func request(t testing.TB, method, rawURL, body string) Request {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	r, err := RequestFromURL(method, u, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fuzzRequest is request for fuzz input: false when rawURL or the
// request is not one a server would get.
func fuzzRequest(method, rawURL, body string) (Request, bool) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Request{}, false
	}
	r, err := RequestFromURL(method, u, []byte(body))
	return r, err == nil
}

func TestVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			r := request(t, v.method, v.url, v.body)
			if got := CanonicalQuery(r.Query); got != v.canonical {
				t.Errorf("canonical query = %q, want %q", got, v.canonical)
			}
			if got := Sign(vectorSecret, r); got != v.sig {
				t.Errorf("signature = %q, want %q", got, v.sig)
			}
			if !Verify(vectorSecret, r, v.sig) {
				t.Error("Verify refused the vector's signature")
			}
		})
	}
}

func TestVerifyRefusesChanges(t *testing.T) {
	base := request(t, "GET", vectors[0].url, "")
	sig := vectors[0].sig
	mutations := map[string]func(r *Request){
		"scheme": func(r *Request) { r.Scheme = "http" },
		"host":   func(r *Request) { r.Host = "evil.example.com" },
		"port":   func(r *Request) { r.Host = "bind.example.com:8443" },
		"method": func(r *Request) { r.Method = "POST" },
		"path":   func(r *Request) { r.Path = "/poll" },
		"nonce":  func(r *Request) { r.Query = url.Values{"s": {"Zr7Q2mWbX9kLp3Vt"}, "n": {"other"}} },
		"extra":  func(r *Request) { r.Query = url.Values{"s": {"Zr7Q2mWbX9kLp3Vt"}, "n": {"bm9uY2UtMDAwMQ"}, "x": {""}} },
		"body":   func(r *Request) { r.Body = []byte("x") },
	}
	for name, mutate := range mutations {
		r := base
		mutate(&r)
		if Verify(vectorSecret, r, sig) {
			t.Errorf("%s: changed request still verifies", name)
		}
	}
	if Verify("another-secret", base, sig) {
		t.Error("another secret verifies")
	}
	for _, bad := range []string{"", "!!!", sig + "A", sig[:len(sig)-1], strings.ToUpper(sig)} {
		if Verify(vectorSecret, base, bad) {
			t.Errorf("signature %q verifies", bad)
		}
	}
}

// otherSpellings returns the other ways to write sig that a lenient
// base64 decoder reads as the same 32 bytes: each other value of the two
// unused low bits of the last character, with padding, in the standard
// alphabet, and with a line break inside (which decoders skip).
func otherSpellings(sig string) []string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var out []string
	if i := strings.IndexByte(alphabet, sig[len(sig)-1]); i >= 0 {
		for bits := 1; bits < 4; bits++ {
			out = append(out, sig[:len(sig)-1]+string(alphabet[i^bits]))
		}
	}
	std := strings.NewReplacer("-", "+", "_", "/").Replace(sig)
	out = append(out, sig+"=", std+"=", sig[:10]+"\n"+sig[10:], sig[:10]+"\r\n"+sig[10:len(sig)-1])
	if std != sig {
		out = append(out, std)
	}
	return out
}

// One signature has exactly one accepted spelling: base64url
// without padding, canonical (the unused bits of the last character are
// zero), 43 characters.
func TestVerifyAcceptsOneSpelling(t *testing.T) {
	for _, v := range vectors {
		r := request(t, v.method, v.url, v.body)
		if !Verify(vectorSecret, r, v.sig) {
			t.Fatalf("%s: the canonical spelling does not verify", v.name)
		}
		for _, other := range otherSpellings(v.sig) {
			if Verify(vectorSecret, r, other) {
				t.Errorf("%s: the spelling %q of %q verifies", v.name, other, v.sig)
			}
		}
	}
	// The first and third vectors use both URL-safe characters, so the
	// standard alphabet is tried on them.
	if !strings.ContainsAny(vectors[0].sig, "-_") || !strings.ContainsAny(vectors[2].sig, "-_") {
		t.Fatal("the vectors no longer exercise the URL-safe alphabet")
	}
}

func TestCanonicalHostAndCase(t *testing.T) {
	r := request(t, "get", vectors[0].url, "")
	r.Scheme, r.Host = "HTTPS", "BIND.example.com:443"
	if got := Sign(vectorSecret, r); got != vectors[0].sig {
		t.Errorf("case and default port must not matter: got %q", got)
	}
}

func TestSignURLRoundTrip(t *testing.T) {
	u, _ := url.Parse("https://bind.example.com/authorize?tenant=acme%20corp")
	signed, err := SignURL(vectorSecret, "sid123", "GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := signed.Query()
	if q.Get("tenant") != "acme corp" || q.Get(ParamSession) != "sid123" || len(q.Get(ParamNonce)) < 22 {
		t.Fatalf("signed URL lost or lacks parameters: %s", signed)
	}
	r, err := RequestFromURL("GET", signed, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !Verify(vectorSecret, r, q.Get(ParamSignature)) {
		t.Fatalf("SignURL's own signature does not verify: %s", signed)
	}
	again, _ := SignURL(vectorSecret, "sid123", "GET", u, nil)
	if again.Query().Get(ParamNonce) == q.Get(ParamNonce) {
		t.Error("two signed URLs share a nonce")
	}
}

func FuzzSignVerify(f *testing.F) {
	for _, v := range vectors {
		f.Add(v.method, v.url, v.body)
	}
	f.Fuzz(func(t *testing.T, method, rawURL, body string) {
		r, ok := fuzzRequest(method, rawURL, body)
		if !ok {
			return
		}
		sig := Sign(vectorSecret, r)
		if !Verify(vectorSecret, r, sig) {
			t.Fatalf("own signature does not verify for %q", rawURL)
		}
		// The canonical query must parse back to the same parameters.
		back, err := url.ParseQuery(CanonicalQuery(r.Query))
		if err != nil {
			t.Fatalf("canonical query does not parse: %v", err)
		}
		r2 := r
		r2.Query = back
		if Sign(vectorSecret, r2) != sig {
			t.Fatalf("canonical query is not canonical for %q", rawURL)
		}
		r3 := r
		r3.Body = append([]byte(body), 'x')
		if Verify(vectorSecret, r3, sig) {
			t.Fatal("signature survives a body change")
		}
		// At most one spelling of a MAC verifies.
		for _, other := range otherSpellings(sig) {
			if Verify(vectorSecret, r, other) {
				t.Fatalf("the spelling %q of %q verifies", other, sig)
			}
		}
	})
}

// FuzzVerify: any string as the signature h of a request. {h} in spelling
// becomes the request's signature and {h-1} that signature without its
// last character, so that the fuzzer varies spellings of a genuine MAC.
//
// Property: at most one spelling of a given MAC verifies — whatever
// verifies is exactly Sign's output.
func FuzzVerify(f *testing.F) {
	for _, v := range vectors {
		for _, spelling := range []string{"{h}", "{h}=", "{h}==", "{h-1}A", "{h-1}B", "{h-1}D", "{h-1}", "{h}\n", "\n{h-1}", "{h-1}+", "{h-1}/"} {
			f.Add(v.method, v.url, v.body, spelling)
		}
		for _, other := range otherSpellings(v.sig) {
			f.Add(v.method, v.url, v.body, other)
		}
	}
	f.Fuzz(func(t *testing.T, method, rawURL, body, spelling string) {
		r, ok := fuzzRequest(method, rawURL, body)
		if !ok {
			return
		}
		sig := Sign(vectorSecret, r)
		cand := strings.NewReplacer("{h}", sig, "{h-1}", sig[:len(sig)-1]).Replace(spelling)
		if Verify(vectorSecret, r, cand) && cand != sig {
			t.Fatalf("the spelling %q of %q verifies", cand, sig)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	r := request(b, "GET", vectors[2].url, "")
	b.ReportAllocs()
	for b.Loop() {
		if !Verify(vectorSecret, r, vectors[2].sig) {
			b.Fatal("no")
		}
	}
}
