package procs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// Command is a running command (a CLI under test) with its stderr read
// line by line, so a test can wait for a line such as the URL it prints.
type Command struct {
	cmd *exec.Cmd
	// Stdout holds all the command wrote to standard output.
	Stdout bytes.Buffer
	// Stderr holds all it wrote to standard error so far.
	Stderr Buffer
	// Ended is when it exited; valid once Exited is closed.
	Ended  time.Time
	lines  chan string
	done   chan struct{} // stderr fully read
	exited chan struct{}
	code   int
}

// Start runs bin with args in dir, with the environment of the test plus
// env (later entries win), until it exits or the test ends (then it is
// killed). Its output is shown when the test failed.
func Start(t tb.TB, dir, bin string, args []string, env ...string) *Command {
	t.Helper()
	c := &Command{cmd: exec.Command(bin, args...), lines: make(chan string, 1000), done: make(chan struct{}), exited: make(chan struct{})}
	c.cmd.Dir = dir
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout = &c.Stdout
	pipe, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(&c.Stderr, sc.Text())
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		<-c.done
		err := c.cmd.Wait()
		c.Ended = time.Now()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			c.code = ee.ExitCode()
		case err != nil:
			c.code = -1
		}
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("%s %v stderr:\n%s", bin, args, c.Stderr.String())
		}
	})
	return c
}

// URL waits up to a minute for the first line of stderr that is an http
// or https URL (what a CLI prints for the user to open), skipping the
// lines before it. Lines are read once: a second call waits for the next
// URL.
func (c *Command) URL(t tb.TB) string {
	t.Helper()
	return c.Line(t, func(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") })
}

// Line waits up to a minute for the next line of stderr (trimmed) that
// match accepts, and returns it.
func (c *Command) Line(t tb.TB, match func(string) bool) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line := <-c.lines:
			if s := strings.TrimSpace(line); match(s) {
				return s
			}
		case <-c.exited:
			t.Fatalf("the command exited (%d) without printing the line waited for:\n%s", c.code, c.Stderr.String())
		case <-timeout:
			t.Fatalf("the line waited for was not printed:\n%s", c.Stderr.String())
		}
	}
}

// Wait waits for the command to exit and returns its exit code; the test
// fails if that takes longer than timeout.
func (c *Command) Wait(t tb.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-c.exited:
		return c.code
	case <-time.After(timeout):
		t.Fatalf("the command did not exit within %s:\n%s", timeout, c.Stderr.String())
		return -1
	}
}

// Exited is closed when the command has exited.
func (c *Command) Exited() <-chan struct{} { return c.exited }

// Running says whether the command has not exited yet.
func (c *Command) Running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the command (e.g. SIGSTOP to hold it).
func (c *Command) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }
