package memory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/conformance"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, limits sessions.Limits, clock *testutil.Clock) sessions.Store {
		return New(limits, clock.Now)
	})
}

// The store keeps at most MaxRecords records: a write past it fails with
// ErrOverBudget and keeps nothing, until collection makes room.
func TestMaxRecords(t *testing.T) {
	clock := testutil.ClockAt(conformance.Start)
	s := New(sessions.Limits{MaxRecords: 3, WriteRate: 1000, WriteBurst: 1000}, clock.Now)
	ctx := context.Background()
	exp := clock.Now().Add(time.Minute)
	if err := s.UseOnce(ctx, "a", exp); err != nil {
		t.Fatal(err)
	}
	if err := s.Deny(ctx, "s1", exp, "no"); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "s2", exp.Add(time.Hour), "kb-ns", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"UseOnce":  s.UseOnce(ctx, "b", exp),
		"Deny":     s.Deny(ctx, "s3", exp, "no"),
		"Complete": s.Complete(ctx, "s3", exp, "kb-ns", []byte(`{}`)),
	} {
		if !errors.Is(err, sessions.ErrOverBudget) || !errors.Is(err, sessions.ErrUnavailable) {
			t.Errorf("%s with the store full: %v, want ErrOverBudget", what, err)
		}
	}
	if _, err := s.Deliver(ctx, "s2", exp); !errors.Is(err, sessions.ErrOverBudget) {
		t.Errorf("first Deliver with the store full: %v, want ErrOverBudget", err)
	}
	if o, d, m := s.Len(); o+d+m != 3 {
		t.Fatalf("the store holds %d outcomes, %d deliveries, %d marks; want 3 in all", o, d, m)
	}
	// Past the first two records' collection time, there is room again.
	clock.Advance(time.Minute + sessions.DefaultLimits.Grace + time.Second)
	if err := s.UseOnce(ctx, "b", clock.Now().Add(time.Minute)); err != nil {
		t.Fatalf("UseOnce after collection: %v", err)
	}
	if _, err := s.Deliver(ctx, "s2", exp.Add(time.Hour)); err != nil {
		t.Fatalf("Deliver after collection: %v", err)
	}
}
