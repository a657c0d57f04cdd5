// Command testreport reads the events of `go test -json` and prints what
// a person needs from them: with -follow, the test output as go test
// prints it without -json, each package's in one piece once it is done,
// from the events on standard input (copied, as they are, to -save);
// without, a table of the
// packages in the given files of events, slowest first, with each one's
// slowest test, and the tests that failed.
//
//	go test -json ./... | testreport -follow -save run.json
//	testreport run.json other.json
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	follow := flag.Bool("follow", false, "print the test output of the events on standard input as they come")
	save := flag.String("save", "", "with -follow, also write the events, as they are, to this file")
	prefix := flag.String("trim", "github.com/kbprovider/backend/", "package path prefix left out of the table")
	flag.Parse()
	var err error
	if *follow {
		err = followEvents(os.Stdin, os.Stdout, *save)
	} else {
		err = printTable(flag.Args(), os.Stdout, *prefix)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
}

// followEvents writes the output of each package's events to out in one
// piece once the package is done (go test -json interleaves the events
// of the packages it runs at the same time), and each line of in to the
// file save (if any). A line that is not an event (go test's build
// errors may come as plain text) is written at once; the output of
// packages whose end never came is written at the end of in.
func followEvents(in io.Reader, out io.Writer, save string) error {
	saved := io.Writer(io.Discard)
	if save != "" {
		f, err := os.Create(save)
		if err != nil {
			return err
		}
		defer f.Close()
		saved = f
	}
	w := bufio.NewWriter(out)
	pending := map[string]*strings.Builder{}
	var order []string // packages by their first event
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := saved.Write(line); werr != nil {
				return werr
			}
			var e event
			switch {
			case json.Unmarshal(line, &e) != nil || e.Action == "":
				w.Write(line)
			case e.Package == "":
				w.WriteString(e.Output)
			default:
				b := pending[e.Package]
				if b == nil {
					b = &strings.Builder{}
					pending[e.Package] = b
					order = append(order, e.Package)
				}
				b.WriteString(e.Output)
				if e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip") {
					w.WriteString(b.String())
					delete(pending, e.Package)
				}
			}
			if ferr := w.Flush(); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	for _, p := range order {
		if b := pending[p]; b != nil {
			w.WriteString(b.String())
			fmt.Fprintf(w, "testreport: the events of %s end before the package did\n", p)
		}
	}
	return w.Flush()
}

// pkgResult is what the table shows of one package.
type pkgResult struct {
	name        string
	elapsed     float64
	result      string // pass, fail, skip; "" if the events end before it did
	slowest     string
	slowestTime float64
	failed      []string
}

func printTable(files []string, out io.Writer, prefix string) error {
	if len(files) == 0 {
		return errors.New("no files of events given")
	}
	pkgs := map[string]*pkgResult{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = readEvents(f, pkgs)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return writeTable(out, pkgs, prefix)
}

func readEvents(in io.Reader, pkgs map[string]*pkgResult) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Package == "" {
			continue
		}
		p := pkgs[e.Package]
		if p == nil {
			p = &pkgResult{name: e.Package}
			pkgs[e.Package] = p
		}
		switch {
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			p.result, p.elapsed = e.Action, e.Elapsed
		case e.Test != "" && e.Action == "fail":
			p.failed = append(p.failed, e.Test)
		case e.Test != "" && e.Action == "pass" && !strings.Contains(e.Test, "/") && e.Elapsed > p.slowestTime:
			p.slowest, p.slowestTime = e.Test, e.Elapsed
		}
	}
	return sc.Err()
}

func writeTable(out io.Writer, pkgs map[string]*pkgResult, prefix string) error {
	rows := make([]*pkgResult, 0, len(pkgs))
	var total float64
	for _, p := range pkgs {
		if p.result == "skip" && p.elapsed == 0 {
			continue // no test files
		}
		rows = append(rows, p)
		total += p.elapsed
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].elapsed != rows[j].elapsed {
			return rows[i].elapsed > rows[j].elapsed
		}
		return rows[i].name < rows[j].name
	})
	w := bufio.NewWriter(out)
	fmt.Fprintf(w, "%-52s %9s  %-6s %s\n", "PACKAGE", "SECONDS", "RESULT", "SLOWEST TEST")
	var failed []string
	for _, p := range rows {
		result := p.result
		if result == "" {
			result = "none" // the events end before the package did: killed or timed out
			failed = append(failed, p.name+" (no result)")
		}
		slowest := ""
		if p.slowest != "" {
			slowest = fmt.Sprintf("%s (%.1fs)", p.slowest, p.slowestTime)
		}
		fmt.Fprintf(w, "%-52s %9.1f  %-6s %s\n", strings.TrimPrefix(p.name, prefix), p.elapsed, result, slowest)
		for _, t := range p.failed {
			failed = append(failed, p.name+" "+t)
		}
		if p.result == "fail" && len(p.failed) == 0 {
			failed = append(failed, p.name+" (the package: its build, TestMain or a panic)")
		}
	}
	fmt.Fprintf(w, "%d packages, %.0fs of test time in all (packages overlap, so more than the wall time)\n", len(rows), total)
	for _, f := range failed {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
	return w.Flush()
}
