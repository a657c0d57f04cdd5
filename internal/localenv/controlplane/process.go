package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// process is one server of the control plane, with its output in a log file.
type process struct {
	name    string
	bin     string
	args    []string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done is closed
}

func startProcess(logDir, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	// Appended to: a restarted server keeps its earlier log.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = os.Environ()
	if err := startCmd(cmd); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, bin: bin, args: args, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process (and anything it started) to end, and kills it
// after grace.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	signalGroup(p.cmd, sigTerm)
	select {
	case <-p.done:
	case <-time.After(grace):
		signalGroup(p.cmd, sigKill)
		<-p.done
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.logPath, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func (p *process) logContains(s string) bool {
	data, _ := os.ReadFile(p.logPath)
	return strings.Contains(string(data), s)
}
