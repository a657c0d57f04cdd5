package node

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestImageLayout reads a written image back as containerd's import does:
// index, manifest, config and layer, each found by its digest, and the
// layer holds the file, executable, and the empty folder.
func TestImageLayout(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := Image{Name: "kbb.local/tool:v1", Files: map[string]string{"/tool": bin}, Dirs: []string{"/tmp"}, Entrypoint: []string{"/tool"}, User: "65532:65532"}
	tarPath := filepath.Join(dir, "image.tar")
	if err := img.WriteOCILayout(tarPath); err != nil {
		t.Fatal(err)
	}
	files := untar(t, tarPath)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	var index struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	mustJSON(t, files["index.json"], &index)
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != img.Name {
		t.Fatalf("index: %s", files["index.json"])
	}
	var manifest struct {
		Config ociDescriptor   `json:"config"`
		Layers []ociDescriptor `json:"layers"`
	}
	mustJSON(t, blob(t, files, index.Manifests[0]), &manifest)
	var config struct {
		Config struct {
			Entrypoint []string
			User       string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	mustJSON(t, blob(t, files, manifest.Config), &config)
	if config.Config.User != img.User || len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/tool" {
		t.Errorf("config: %+v", config.Config)
	}
	if len(manifest.Layers) != 1 || len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Fatalf("an uncompressed layer's diff ID is its digest: manifest %+v, config %+v", manifest.Layers, config.RootFS)
	}
	tr := tar.NewReader(bytes.NewReader(blob(t, files, manifest.Layers[0])))
	seen := map[string]int64{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = h.Mode
	}
	if seen["tool"] != 0o755 || seen["tmp/"] != 0o1777 || len(seen) != 2 {
		t.Errorf("layer entries %v", seen)
	}
	// The same files make the same image.
	again := filepath.Join(dir, "again.tar")
	if err := img.WriteOCILayout(again); err != nil {
		t.Fatal(err)
	}
	if a, b := untar(t, again)["index.json"], files["index.json"]; !bytes.Equal(a, b) {
		t.Errorf("the same image twice has two digests")
	}
}

func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
}

func blob(t *testing.T, files map[string][]byte, d ociDescriptor) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+d.Digest[len("sha256:"):]]
	if !ok || len(b) != d.Size || "sha256:"+hexOf(b) != d.Digest {
		t.Fatalf("blob %s missing or not matching its descriptor", d.Digest)
	}
	return b
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}
