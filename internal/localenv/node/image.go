package node

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Image is a FROM scratch container image: files from this machine in one
// uncompressed layer. No registry is reachable here, so images are written
// as OCI image layout tars and imported into containerd with ctr.
type Image struct {
	// Name is the image reference, e.g. "kbb.local/backend:test"; pods
	// name it with imagePullPolicy Never or IfNotPresent.
	Name string
	// Files maps a path in the image ("/backend") to a file on this
	// machine; each is stored with mode 0755.
	Files map[string]string
	// Entrypoint and User go into the image config (User "" is root).
	Entrypoint []string
	User       string
	// Dirs are empty directories to create (mode 1777), e.g. "/tmp".
	Dirs []string
}

// WriteOCILayout writes img as an OCI image layout tar to path, with the
// annotation containerd's import takes the image's name from.
func (img Image) WriteOCILayout(path string) error {
	layer, err := img.layer()
	if err != nil {
		return err
	}
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"User":       img.User,
			"WorkingDir": "/",
			"Env":        []string{"PATH=/"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := descriptor("application/vnd.oci.image.config.v1+json", config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []ociDescriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": tag,
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []ociDescriptor{manifestDesc},
	})
	if err != nil {
		return err
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"blobs/sha256/" + hexOf(manifest), manifest},
		{"blobs/sha256/" + hexOf(config), config},
		{"blobs/sha256/" + hexOf(layer), layer},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}); err != nil {
			f.Close()
			return err
		}
	}
	for _, e := range entries {
		if err := writeTarFile(tw, e.name, e.data, 0o644); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// layer is the image's only layer, an uncompressed tar.
func (img Image) layer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, dir := range img.Dirs {
		name := strings.TrimPrefix(dir, "/") + "/"
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o1777, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	// Sorted: the same files make the same layer digest.
	for _, inImage := range slices.Sorted(maps.Keys(img.Files)) {
		src := img.Files[inImage]
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		if err := writeTarFile(tw, strings.TrimPrefix(inImage, "/"), data, 0o755); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, name string, data []byte, mode int64) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func descriptor(mediaType string, data []byte) ociDescriptor {
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hexOf(data), Size: len(data)}
}

func hexOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
