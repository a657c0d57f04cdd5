//go:build linux

// Command netbridge runs a program inside a network namespace of its own
// while letting it reach chosen TCP addresses of the host's loopback.
//
// The konnector package starts netbridge in a new network namespace (where only
// a down loopback exists) and listens on a unix socket per address on the
// host side; unix sockets are not network-namespaced, so netbridge brings
// lo up, listens on each 127.0.0.1:<port> inside the namespace and pipes
// every connection to its socket. The same port as on the host keeps the
// URLs (and so the TLS server names) the program uses unchanged. Then it
// starts the program, relays SIGTERM and SIGINT to it, and exits as it
// does. The program dies with netbridge (parent-death signal).
//
// Usage:
//
//	netbridge -forward 127.0.0.1:6443=/tmp/x/6443.sock [-forward ...] -- program args...
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kbprovider/backend/internal/localenv/konnector/bridgepipe"
)

type forwards []string

func (f *forwards) String() string     { return strings.Join(*f, ",") }
func (f *forwards) Set(s string) error { *f = append(*f, s); return nil }

func main() {
	var fw forwards
	flag.Var(&fw, "forward", "listen-address=unix-socket-path (repeatable)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "netbridge: no program given (netbridge -forward a=b -- program args...)")
		os.Exit(2)
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintf(os.Stderr, "netbridge: bringing lo up: %v\n", err)
		os.Exit(1)
	}
	for _, f := range fw {
		addr, sock, ok := strings.Cut(f, "=")
		if !ok || addr == "" || sock == "" {
			fmt.Fprintf(os.Stderr, "netbridge: -forward %q: want listen-address=unix-socket-path\n", f)
			os.Exit(2)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "netbridge: %v\n", err)
			os.Exit(1)
		}
		go serve(l, sock)
	}
	os.Exit(runChild(flag.Args()))
}

// loopbackUp sets IFF_UP on lo, which a new network namespace has down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// serve pipes each connection accepted on l to a new connection to the
// unix socket sock. It runs until the process ends.
func serve(l net.Listener, sock string) {
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintf(os.Stderr, "netbridge: accept on %s: %v\n", l.Addr(), err)
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("unix", sock)
			if err != nil {
				fmt.Fprintf(os.Stderr, "netbridge: %s: %v\n", l.Addr(), err)
				return
			}
			defer u.Close()
			bridgepipe.Pipe(c, u)
		}()
	}
}

// runChild starts the program with the parent-death signal and returns its
// exit code. The main goroutine stays locked to the thread that started the
// child: the signal fires when that thread ends, not the process.
func runChild(args []string) int {
	runtime.LockOSThread()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "netbridge: %v\n", err)
		return 1
	}
	go func() {
		for s := range sigc {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "netbridge: %s: %v\n", args[0], err)
		return 1
	}
}
