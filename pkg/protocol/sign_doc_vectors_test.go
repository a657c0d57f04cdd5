package protocol

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// docPath is the protocol document whose signing vectors and worked
// example must agree with this package.
const docPath = "../../docs/protocol.md"

type docVector struct {
	num, method, url, body, canonical, sig string
}

// readDocVectors parses the vector table between the signing-vectors
// markers of docs/protocol.md.
func readDocVectors(t *testing.T, doc []byte) []docVector {
	t.Helper()
	var out []docVector
	in := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "<!-- signing-vectors: begin"):
			in = true
			continue
		case strings.HasPrefix(line, "<!-- signing-vectors: end"):
			in = false
			continue
		}
		if !in || !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| #") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 6 {
			t.Fatalf("%s: vector row has %d cells, want 6: %s", docPath, len(cells), line)
		}
		for i, c := range cells {
			c = strings.TrimSpace(c)
			switch c {
			case "(none)", "(empty)":
				c = ""
			default:
				if !strings.HasPrefix(c, "`") || !strings.HasSuffix(c, "`") || len(c) < 2 {
					if i != 0 {
						t.Fatalf("%s: cell %q of %s is not in backticks", docPath, c, line)
					}
				}
				c = strings.Trim(c, "`")
			}
			cells[i] = c
		}
		out = append(out, docVector{cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]})
	}
	return out
}

// TestDocVectors keeps docs/protocol.md's test vectors and worked example
// true: every row is checked against this package, and the document must
// carry the same vectors as vectors in hmac_test.go.
func TestDocVectors(t *testing.T) {
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("reading the protocol document: %v", err)
	}
	got := readDocVectors(t, doc)
	if len(got) != len(vectors) {
		t.Fatalf("%s has %d signing vectors, want %d (the vectors of hmac_test.go)", docPath, len(got), len(vectors))
	}
	for i, v := range got {
		t.Run("vector "+v.num, func(t *testing.T) {
			r := request(t, v.method, v.url, v.body)
			if c := CanonicalQuery(r.Query); c != v.canonical {
				t.Errorf("document's canonical query %q, code makes %q", v.canonical, c)
			}
			if s := Sign(vectorSecret, r); s != v.sig {
				t.Errorf("document's signature %q, code makes %q", v.sig, s)
			}
			// The same request as hmac_test.go's vector, which came from
			// the wire contract.
			want := vectors[i]
			wr := request(t, want.method, want.url, want.body)
			if string(Payload(r)) != string(Payload(wr)) || v.sig != want.sig {
				t.Errorf("document's vector %s differs from hmac_test.go's vector %q", v.num, want.name)
			}
		})
	}
	if !bytes.Contains(doc, []byte(vectorSecret)) {
		t.Errorf("%s does not name the vectors' secret %s", docPath, vectorSecret)
	}

	// The worked example shows the payload of vector 1, line by line.
	_, rest, ok := bytes.Cut(doc, []byte("<!-- worked-example-payload"))
	if !ok {
		t.Fatalf("%s lacks the worked-example-payload marker", docPath)
	}
	_, rest, _ = bytes.Cut(rest, []byte("```\n"))
	block, _, ok := bytes.Cut(rest, []byte("\n```"))
	if !ok {
		t.Fatalf("%s: no code block after the worked-example-payload marker", docPath)
	}
	r := request(t, got[0].method, got[0].url, "")
	if p := Payload(r); !bytes.Equal(block, p) {
		t.Errorf("worked example payload\n%s\nthe code signs\n%s", block, p)
	}
	if h := hex.EncodeToString(mac(nil, vectorSecret, r)); !bytes.Contains(doc, []byte("`"+h+"`")) {
		t.Errorf("%s does not show vector 1's HMAC in hex, %s", docPath, h)
	}
	// The prose spells out vector 4's payload with \n for line feeds.
	r4 := request(t, got[3].method, got[3].url, got[3].body)
	if p4 := strings.ReplaceAll(string(Payload(r4)), "\n", `\n`); !bytes.Contains(doc, []byte("`"+p4+"`")) {
		t.Errorf("%s does not spell out vector 4's payload %s", docPath, p4)
	}
}
