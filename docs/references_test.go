// Package docs_test checks that the references between the docs and the
// code resolve: a section a Go comment cites exists, and a path a document
// names is in the tree.
package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the checkout, this folder's parent.
const root = ".."

// skipDir: folders of tools and outputs, not of the project's text.
func skipDir(name string) bool {
	return name == "node_modules" || name == "_artifacts" || name == "testdata" || strings.HasPrefix(name, ".")
}

// walk calls fn with the path (relative to root) and contents of every
// file whose name ends with one of exts.
func walk(t *testing.T, fn func(path, text string), exts ...string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		for _, ext := range exts {
			if strings.HasSuffix(p, ext) {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(root, p)
				fn(filepath.ToSlash(rel), string(b))
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var (
	// "docs/protocol.md §3", "docs/protocol.md §2, §3 and §6", also
	// across the lines of a Go comment
	sectionRef = regexp.MustCompile(`docs/([a-z0-9-]+\.md)((?:(?:[,\s]|and|//)+§\d+)+)`)
	sectionNum = regexp.MustCompile(`§(\d+)`)
)

// TestCitedSectionsExist: every numbered section a Go comment or a
// document cites is a numbered heading ("## 3. …") of that document.
func TestCitedSectionsExist(t *testing.T) {
	headings := map[string]map[string]bool{}
	numbered := regexp.MustCompile(`(?m)^#{2,3} (\d+)\. `)
	check := func(path, text string) {
		for _, m := range sectionRef.FindAllStringSubmatch(text, -1) {
			doc := m[1]
			if headings[doc] == nil {
				b, err := os.ReadFile(doc)
				if err != nil {
					t.Errorf("%s cites %s, which does not exist", path, "docs/"+doc)
					headings[doc] = map[string]bool{}
					continue
				}
				headings[doc] = map[string]bool{}
				for _, h := range numbered.FindAllStringSubmatch(string(b), -1) {
					headings[doc][h[1]] = true
				}
			}
			for _, n := range sectionNum.FindAllStringSubmatch(m[2], -1) {
				if !headings[doc][n[1]] {
					t.Errorf("%s cites docs/%s §%s, which has no such section", path, doc, n[1])
				}
			}
		}
	}
	walk(t, check, ".go", ".md", ".sh")
}

// codePath is a path of the tree in backticks or a link: a folder of
// code, with or without a file name.
var codePath = regexp.MustCompile("(?:`|\\]\\()((?:\\.\\./)*(?:internal|cmd|pkg|hack|test|charts|deploy|web)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")

// goSymbol is a Go identifier after a package path ("pkg/protocol.ClusterProof").
var goSymbol = regexp.MustCompile(`\.[A-Z][A-Za-z0-9_]*$`)

// upstreamPaths are paths of upstream kube-bind's tree that the documents
// name as such, not paths of this one.
var upstreamPaths = map[string]bool{
	"pkg/konnector/controllers/cluster": true, // the konnector's controllers
	"deploy/crd":                        true, // upstream's CRDs
}

// TestNamedPathsExist: every path of the tree a document names (in
// backticks or as a link) is there.
func TestNamedPathsExist(t *testing.T) {
	walk(t, func(path, text string) {
		for _, m := range codePath.FindAllStringSubmatch(text, -1) {
			p := goSymbol.ReplaceAllString(m[1], "")
			if upstreamPaths[p] {
				continue
			}
			// A link is relative to the document; a path in backticks to the checkout.
			target := filepath.Join(root, strings.TrimLeft(p, "./"))
			if strings.HasPrefix(p, "../") {
				target = filepath.Join(root, filepath.Dir(path), p)
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s names %s, which is not in the tree", path, p)
			}
		}
	}, ".md")
}
