package health

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	st := NewStatus("oidc", errors.New("discovery failing"))
	block := CheckFunc("slow", func(ctx context.Context) error { <-ctx.Done(); return nil })
	ok := CheckFunc("ok", func(context.Context) error { return nil })
	boom := CheckFunc("boom", func(context.Context) error { panic("x") })

	start := time.Now()
	res := Run(context.Background(), []Check{st, block, ok, boom}, 50*time.Millisecond)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Run took %s, want bounded by the timeout", d)
	}
	want := []struct {
		name string
		ok   bool
	}{{"oidc", false}, {"slow", false}, {"ok", true}, {"boom", false}}
	for i, w := range want {
		if res[i].Name != w.name || (res[i].Err == nil) != w.ok {
			t.Errorf("result %d = %+v, want name %s ok=%v", i, res[i], w.name, w.ok)
		}
	}
	if !errors.Is(res[1].Err, ErrTimeout) {
		t.Errorf("slow check: %v, want ErrTimeout", res[1].Err)
	}

	st.Set(nil)
	if res := Run(context.Background(), []Check{st}, time.Second); res[0].Err != nil {
		t.Errorf("after Set(nil): %v", res[0].Err)
	}
}
