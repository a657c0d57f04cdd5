package longpoll

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/flagvalue"
)

func TestPreferWait(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   int64
		ok     bool
	}{
		{nil, 0, false},
		{[]string{"wait=10"}, 10, true},
		{[]string{"WAIT = 7"}, 7, true},
		{[]string{`wait="12"`}, 12, true},
		{[]string{"respond-async, wait=5"}, 5, true},
		{[]string{"respond-async", "wait=5"}, 5, true},
		{[]string{"handling=lenient; x=1, wait=3;foo=bar"}, 3, true},
		{[]string{`return="a,wait=9", wait=4`}, 4, true},
		{[]string{"wait=5, wait=9"}, 5, true},     // the first one counts
		{[]string{"wait=soon, wait=9"}, 0, false}, // the first is malformed: ignored
		{[]string{"wait"}, 0, false},              // no value
		{[]string{"wait="}, 0, false},             // empty value
		{[]string{"wait=-1"}, 0, false},           // not delta-seconds
		{[]string{"wait=1.5"}, 0, false},          // not delta-seconds
		{[]string{"wait=5 junk"}, 0, false},       // trailing garbage
		{[]string{`wait="5`}, 0, false},           // unterminated quote
		{[]string{"wait=99999999999999999999"}, maxDeltaSeconds, true},
		{[]string{"=5, wait=2"}, 2, true}, // a malformed element is skipped
		{[]string{"waiting=5"}, 0, false},
		{[]string{",,  , wait=0"}, 0, true},
	} {
		got, ok := PreferWait(tc.values)
		if got != tc.want || ok != tc.ok {
			t.Errorf("PreferWait(%q) = %d, %v; want %d, %v", tc.values, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzPreferWait(f *testing.F) {
	for _, s := range []string{"wait=10", `wait="3", x`, "respond-async, wait=5;a=b", `return="a,\"wait=9", wait=4`, "wait=99999999999999999999", ""} {
		f.Add(s, 7)
	}
	f.Fuzz(func(t *testing.T, header string, n int) {
		secs, ok := PreferWait([]string{header})
		if ok && (secs < 0 || secs > maxDeltaSeconds) {
			t.Fatalf("%q: %d seconds", header, secs)
		}
		if !ok && secs != 0 {
			t.Fatalf("%q: not ok but %d", header, secs)
		}
		// A well-formed wait first in the list is always read.
		if n >= 0 {
			got, ok := PreferWait([]string{"wait=" + strconv.Itoa(n) + ", " + header})
			if !ok || got != min(int64(n), maxDeltaSeconds) {
				t.Fatalf("wait=%d before %q: %d, %v", n, header, got, ok)
			}
		}
	})
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		errs int
	}{
		{Options{MaxWait: DefaultMaxWait, MaxHeld: DefaultMaxHeld}, 0},
		{Options{MaxWait: 0, MaxHeld: 1}, 0},
		{Options{MaxWait: UpperMaxWait, MaxHeld: 1}, 0},
		{Options{MaxWait: UpperMaxWait + time.Second, MaxHeld: 1}, 1},
		{Options{MaxWait: -time.Second, MaxHeld: 1}, 1},
		{Options{MaxWait: 1500 * time.Millisecond, MaxHeld: 1}, 1},
		{Options{MaxWait: time.Second, MaxHeld: 0}, 1},
	} {
		if errs := tc.o.Validate(); len(errs) != tc.errs {
			t.Errorf("%+v: %v, want %d errors", tc.o, errs, tc.errs)
		}
	}
}

// The flags' defaults pass Validate, and its errors name the flags.
func TestOptionsFlags(t *testing.T) {
	var o Options
	if err := flagvalue.Parse(nil, o.AddFlags); err != nil || o != (Options{MaxWait: DefaultMaxWait, MaxHeld: DefaultMaxHeld}) || len(o.Validate()) > 0 {
		t.Errorf("defaults: %+v %v %v", o, err, o.Validate())
	}
	for args, want := range map[string]string{
		"--long-poll-max-wait=2m":     "--long-poll-max-wait 2m0s: want whole seconds from 0 (off) to 50s",
		"--long-poll-max-wait=1500ms": "--long-poll-max-wait 1.5s: want whole seconds",
		"--max-long-polls=0":          "--max-long-polls 0: must be positive",
	} {
		var o Options
		if err := flagvalue.Parse([]string{args}, o.AddFlags); err != nil {
			t.Fatal(err)
		}
		if errs := o.Validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), want) {
			t.Errorf("%s: %v, want %q", args, errs, want)
		}
	}
}

func header(v string) http.Header { return http.Header{"Prefer": {v}} }

func TestWantedCapsAndOff(t *testing.T) {
	h := New(Options{MaxWait: 20 * time.Second, MaxHeld: 2})
	for v, want := range map[string]time.Duration{"wait=5": 5 * time.Second, "wait=600": 20 * time.Second} {
		if d, ok := h.Wanted(header(v)); !ok || d != want {
			t.Errorf("%s: %s, %v; want %s", v, d, ok, want)
		}
	}
	for _, v := range []string{"wait=0", "wait=x", "respond-async"} {
		if d, ok := h.Wanted(header(v)); ok {
			t.Errorf("%s: held for %s", v, d)
		}
	}
	off := New(Options{MaxWait: 0, MaxHeld: 2})
	if off != nil {
		t.Fatal("MaxWait 0 made a Holder")
	}
	if _, ok := off.Wanted(header("wait=5")); ok || off.MaxWait() != 0 || off.Held() != 0 {
		t.Fatal("a nil Holder holds")
	}
	if _, _, ok := off.Hold(context.Background(), time.Second); ok {
		t.Fatal("a nil Holder holds")
	}
	off.Release()
}

func TestHoldLimitAndRelease(t *testing.T) {
	h := New(Options{MaxWait: 30 * time.Second, MaxHeld: 2})
	ctx1, done1, ok1 := h.Hold(context.Background(), 30*time.Second)
	ctx2, done2, ok2 := h.Hold(context.Background(), 30*time.Second)
	if !ok1 || !ok2 || h.Held() != 2 {
		t.Fatalf("two holds: %v %v, held %d", ok1, ok2, h.Held())
	}
	if _, _, ok := h.Hold(context.Background(), time.Second); ok || h.Refused() != 1 {
		t.Fatalf("a third hold beyond MaxHeld 2 was granted (refused %d)", h.Refused())
	}
	done2()
	if ctx2.Err() == nil || h.Held() != 1 {
		t.Fatalf("done did not end the hold: %v, held %d", ctx2.Err(), h.Held())
	}
	ctx3, done3, ok := h.Hold(context.Background(), 30*time.Second)
	if !ok {
		t.Fatal("a freed slot was not given again")
	}
	h.Release()
	for i, c := range []context.Context{ctx1, ctx3} {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("held poll %d not released by Release", i)
		}
	}
	done1()
	done3()
	if h.Held() != 0 {
		t.Fatalf("held %d after every done", h.Held())
	}
	if _, _, ok := h.Hold(context.Background(), time.Second); ok {
		t.Fatal("Hold granted after Release")
	}
	h.Release() // twice is fine
}

func TestHoldEndsAfterWait(t *testing.T) {
	h := New(Options{MaxWait: 30 * time.Second, MaxHeld: 1})
	ctx, done, ok := h.Hold(context.Background(), 100*time.Millisecond)
	if !ok {
		t.Fatal("not held")
	}
	defer done()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the hold did not end after its wait")
	}
	done()
	done() // once is enough; more do nothing
	parent, cancel := context.WithCancel(context.Background())
	ctx, done2, ok := h.Hold(parent, time.Minute)
	if !ok {
		t.Fatal("the slot of a finished hold was not freed")
	}
	cancel()
	<-ctx.Done()
	done2()
}

func TestApplied(t *testing.T) {
	if got := Applied(30 * time.Second); got != "wait=30" {
		t.Fatal(got)
	}
}
