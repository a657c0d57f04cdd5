package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const events = `{"Action":"start","Package":"m/fast"}
{"Action":"run","Package":"m/fast","Test":"TestA"}
{"Action":"output","Package":"m/fast","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"start","Package":"m/slow"}
{"Action":"output","Package":"m/slow","Output":"slow starts\n"}
{"Action":"output","Package":"m/fast","Test":"TestA","Output":"--- PASS: TestA (0.50s)\n"}
{"Action":"pass","Package":"m/fast","Test":"TestA","Elapsed":0.5}
{"Action":"output","Package":"m/fast","Output":"ok  \tm/fast\t0.6s\n"}
{"Action":"pass","Package":"m/fast","Elapsed":0.6}
# m/broken
{"Action":"pass","Package":"m/slow","Test":"TestQuick","Elapsed":1}
{"Action":"pass","Package":"m/slow","Test":"TestLong/sub","Elapsed":40}
{"Action":"pass","Package":"m/slow","Test":"TestLong","Elapsed":41}
{"Action":"output","Package":"m/slow","Test":"TestBad","Output":"    bad_test.go:9: wrong\n"}
{"Action":"fail","Package":"m/slow","Test":"TestBad","Elapsed":2}
{"Action":"fail","Package":"m/slow","Elapsed":44.2}
{"Action":"start","Package":"m/none"}
{"Action":"skip","Package":"m/none","Elapsed":0}
{"Action":"start","Package":"m/hung"}
{"Action":"output","Package":"m/hung","Test":"TestFirst","Output":"hung's last words\n"}
{"Action":"pass","Package":"m/hung","Test":"TestFirst","Elapsed":3}
`

func TestFollowPrintsEachPackageWholeAndSavesEvents(t *testing.T) {
	save := filepath.Join(t.TempDir(), "events.json")
	var out strings.Builder
	if err := followEvents(strings.NewReader(events), &out, save); err != nil {
		t.Fatal(err)
	}
	// Each package in one piece, though their events interleave.
	want := "=== RUN   TestA\n--- PASS: TestA (0.50s)\nok  \tm/fast\t0.6s\n# m/broken\n" +
		"slow starts\n    bad_test.go:9: wrong\n" +
		"hung's last words\ntestreport: the events of m/hung end before the package did\n"
	if out.String() != want {
		t.Errorf("output:\n%q\nwant\n%q", out.String(), want)
	}
	saved, err := os.ReadFile(save)
	if err != nil {
		t.Fatal(err)
	}
	if string(saved) != events {
		t.Errorf("saved events differ from the input:\n%s", saved)
	}
}

func TestTableSlowestFirstWithFailures(t *testing.T) {
	file := filepath.Join(t.TempDir(), "events.json")
	if err := os.WriteFile(file, []byte(events), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := printTable([]string{file}, &out, "m/"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	wantPrefixes := []string{
		"PACKAGE",
		"slow ",
		"fast ",
		"hung ",
		"3 packages, 45s",
		"FAILED: m/slow TestBad",
		"FAILED: m/hung (no result)",
	}
	if len(lines) != len(wantPrefixes) {
		t.Fatalf("table:\n%s\nwant %d lines", out.String(), len(wantPrefixes))
	}
	for i, p := range wantPrefixes {
		if !strings.HasPrefix(lines[i], p) {
			t.Errorf("line %d is %q, want it to start with %q", i, lines[i], p)
		}
	}
	if !strings.Contains(lines[1], "fail") || !strings.Contains(lines[1], "TestLong (41.0s)") {
		t.Errorf("slow's row %q lacks its result or slowest top-level test", lines[1])
	}
	if !strings.Contains(lines[3], "none") {
		t.Errorf("hung's row %q does not say it has no result", lines[3])
	}
}
