// Package image_test keeps the Dockerfile honest without a Docker engine: it
// runs the Dockerfile's own go build instruction, verbatim, on a copy of the
// tree filtered by .dockerignore (the build context), and checks the result.
package image_test

import (
	"bufio"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// testVersion is stamped by the test; it must appear in the binary.
const testVersion = "v9.8.7-image-test"

// instruction is one Dockerfile instruction with continuations joined.
type instruction struct {
	cmd  string // upper case: FROM, ARG, RUN, ...
	args string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") { // comment inside a continued instruction
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		fields := strings.SplitN(cur.String(), " ", 2)
		ins := instruction{cmd: strings.ToUpper(fields[0])}
		if len(fields) == 2 {
			ins.args = strings.TrimSpace(fields[1])
		}
		out = append(out, ins)
		cur.Reset()
	}
	return out
}

// stage is the instructions of one FROM ... section.
type stage struct {
	from string
	ins  []instruction
}

func stages(all []instruction) (globalArgs []instruction, st []stage) {
	for _, in := range all {
		switch {
		case in.cmd == "FROM":
			st = append(st, stage{from: in.args})
		case len(st) == 0:
			globalArgs = append(globalArgs, in)
		default:
			st[len(st)-1].ins = append(st[len(st)-1].ins, in)
		}
	}
	return globalArgs, st
}

func argDefault(t *testing.T, ins []instruction, name string) string {
	t.Helper()
	for _, in := range ins {
		if in.cmd == "ARG" && strings.HasPrefix(in.args, name+"=") {
			return strings.TrimPrefix(in.args, name+"=")
		}
	}
	t.Fatalf("Dockerfile declares no ARG %s with a default", name)
	return ""
}

func TestGoVersionMatchesGoMod(t *testing.T) {
	root := procs.RepoRoot()
	global, _ := stages(parseDockerfile(t, filepath.Join(root, "Dockerfile")))
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for _, directive := range []string{"toolchain go", "go "} { // toolchain wins if present
		if m := regexp.MustCompile(`(?m)^` + directive + `(\S+)`).FindSubmatch(goMod); m != nil && want == "" {
			want = string(m[1])
		}
	}
	if want == "" {
		t.Fatal("go.mod has no go directive")
	}
	if got := argDefault(t, global, "GO_VERSION"); got != want {
		t.Fatalf("Dockerfile builds with Go %s, go.mod asks for %s: update ARG GO_VERSION", got, want)
	}
}

func TestFinalImageIsMinimalAndNonRoot(t *testing.T) {
	_, st := stages(parseDockerfile(t, filepath.Join(procs.RepoRoot(), "Dockerfile")))
	if len(st) < 2 {
		t.Fatalf("want a multi-stage build, got %d stage(s)", len(st))
	}
	final := st[len(st)-1]
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") || !strings.HasSuffix(final.from, ":nonroot") {
		t.Errorf("final stage is FROM %q, want distroless static :nonroot", final.from)
	}
	var user, entrypoint string
	for _, in := range final.ins {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "RUN":
			t.Errorf("final stage runs %q; it has no shell and must not need one", in.args)
		}
	}
	if user != "65532:65532" {
		t.Errorf("final stage USER %q, want 65532:65532", user)
	}
	if entrypoint != `["/backend"]` {
		t.Errorf("ENTRYPOINT %s, want [\"/backend\"]", entrypoint)
	}
}

// buildCommand returns the shell command of the RUN that calls go build,
// with BuildKit's --mount options removed and the stage's build arguments
// substituted (TARGETOS/TARGETARCH for this machine, VERSION for the test).
func buildCommand(t *testing.T, st []stage, outDir string) string {
	t.Helper()
	var build *stage
	var run string
	for i := range st {
		for _, in := range st[i].ins {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				if build != nil {
					t.Fatal("more than one RUN with go build; the test checks exactly one")
				}
				build, run = &st[i], in.args
			}
		}
	}
	if build == nil {
		t.Fatal("no RUN instruction with go build in the Dockerfile")
	}
	for strings.HasPrefix(run, "--") {
		_, rest, _ := strings.Cut(run, " ")
		run = strings.TrimSpace(rest)
	}
	args := map[string]string{}
	for _, in := range build.ins {
		if in.cmd == "ARG" {
			name, def, _ := strings.Cut(in.args, "=")
			args[name] = def
		}
	}
	args["TARGETOS"] = goEnv(t, "GOOS")
	args["TARGETARCH"] = goEnv(t, "GOARCH")
	args["VERSION"] = testVersion
	var missing []string
	run = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`).ReplaceAllStringFunc(run, func(m string) string {
		name := strings.Trim(m, "${}")
		v, ok := args[name]
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		t.Fatalf("the go build RUN uses %v, which its stage does not declare with ARG", missing)
	}
	if !strings.Contains(run, "-o /out/backend ") {
		t.Fatalf("go build RUN does not write /out/backend: %s", run)
	}
	return strings.Replace(run, "-o /out/backend ", "-o "+filepath.Join(outDir, "backend")+" ", 1)
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// dockerignore compiles the plain patterns of .dockerignore. A path is
// excluded when it or one of its parent directories matches.
func dockerignore(t *testing.T, root string) func(rel string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var res []*regexp.Regexp
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore exception %q: this test only understands plain patterns", line)
		}
		var re strings.Builder
		re.WriteString("^")
		p := strings.Trim(line, "/")
		for i := 0; i < len(p); i++ {
			switch {
			case strings.HasPrefix(p[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case p[i] == '*':
				re.WriteString("[^/]*")
			case p[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(string(p[i])))
			}
		}
		re.WriteString("$")
		res = append(res, regexp.MustCompile(re.String()))
	}
	return func(rel string) bool {
		for p := rel; p != "." && p != "/"; p = filepath.Dir(p) {
			for _, re := range res {
				if re.MatchString(filepath.ToSlash(p)) {
					return true
				}
			}
		}
		return false
	}
}

// buildContext copies the tree minus .dockerignore's exclusions.
func buildContext(t *testing.T, root string) string {
	t.Helper()
	ignored := dockerignore(t, root)
	dst := t.TempDir()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "." {
			return nil
		}
		if ignored(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			return copyFile(path, target)
		default:
			return nil // sockets, symlinks: not part of a Go build
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func TestDockerfileBuildStep(t *testing.T) {
	root := procs.RepoRoot()
	_, st := stages(parseDockerfile(t, filepath.Join(root, "Dockerfile")))
	outDir := t.TempDir()
	cmdline := buildCommand(t, st, outDir)
	ctxDir := buildContext(t, root)
	t.Logf("running the Dockerfile's build step in a copy of the build context:\n%s", cmdline)

	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = ctxDir
	// The builder image sets nothing else that matters; the RUN line sets
	// CGO_ENABLED, GOOS, GOARCH, GOFLAGS and GOTOOLCHAIN itself.
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's go build fails: %v\n%s", err, out)
	}
	bin := filepath.Join(outDir, "backend")

	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if info.Path != "github.com/kbprovider/backend/cmd/backend" {
		t.Errorf("built %s, want github.com/kbprovider/backend/cmd/backend", info.Path)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
		if settings[k] != want {
			t.Errorf("build setting %s=%q, want %q", k, settings[k], want)
		}
	}
	// (-trimpath keeps -ldflags out of the build info; the version check
	// below runs the binary instead.)
	// Static: no ELF interpreter, so it runs on distroless/static.
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked (has PT_INTERP); distroless/static cannot run it")
		}
	}
	// -X only takes effect if the variable exists: the binary must report
	// the stamped version.
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), testVersion) {
		t.Errorf("backend --version printed %q, want %q: is github.com/kbprovider/backend/internal/version.Version still the variable?", out, testVersion)
	}
}
