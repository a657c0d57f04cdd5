package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// buildLikeDockerfile runs the Dockerfile's go build RUN instruction (its
// --mount options dropped, its build arguments filled in) with the output
// at bin, so the pods run the binary the image would hold; test/image
// checks that instruction and its result in detail.
func buildLikeDockerfile(bin string) error {
	root := procs.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return err
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var run string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			run = strings.TrimSpace(strings.TrimPrefix(line, "RUN "))
		}
	}
	if run == "" {
		return fmt.Errorf("no go build RUN instruction in the Dockerfile")
	}
	for strings.HasPrefix(run, "--") {
		_, rest, _ := strings.Cut(run, " ")
		run = strings.TrimSpace(rest)
	}
	args := map[string]string{"TARGETOS": "linux", "TARGETARCH": runtime.GOARCH, "VERSION": backendVersion}
	run = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`).ReplaceAllStringFunc(run, func(m string) string {
		if v, ok := args[strings.Trim(m, "${}")]; ok {
			return v
		}
		return m
	})
	if !strings.Contains(run, "-o /out/backend ") {
		return fmt.Errorf("the Dockerfile's go build does not write /out/backend: %s", run)
	}
	run = strings.Replace(run, "-o /out/backend ", "-o "+bin+" ", 1)
	cmd := exec.Command("sh", "-c", run)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the Dockerfile's go build: %w\n%s", err, out)
	}
	return nil
}
