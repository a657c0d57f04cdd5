package fakes

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// FlakyStore fails every call with an error while Down holds (the
// provider cluster briefly unreachable: sessions.ErrUnavailable), and
// passes calls to the Store underneath otherwise.
type FlakyStore struct {
	sessions.Store
	// Only, if set before use, limits the failures to the methods named.
	Only map[string]bool
	fail atomic.Pointer[error]
}

var _ sessions.Store = (*FlakyStore)(nil)

// Down makes the calls fail with err.
func (f *FlakyStore) Down(err error) { f.fail.Store(&err) }

// Up ends Down.
func (f *FlakyStore) Up() { f.fail.Store(nil) }

func (f *FlakyStore) err(method string) error {
	if p := f.fail.Load(); p != nil && (f.Only == nil || f.Only[method]) {
		return *p
	}
	return nil
}

func (f *FlakyStore) Outcome(ctx context.Context, id string) (sessions.Outcome, error) {
	if err := f.err("Outcome"); err != nil {
		return sessions.Outcome{}, err
	}
	return f.Store.Outcome(ctx, id)
}

func (f *FlakyStore) Complete(ctx context.Context, id string, expires time.Time, ns string, response []byte) error {
	if err := f.err("Complete"); err != nil {
		return err
	}
	return f.Store.Complete(ctx, id, expires, ns, response)
}

func (f *FlakyStore) Deny(ctx context.Context, id string, expires time.Time, reason string) error {
	if err := f.err("Deny"); err != nil {
		return err
	}
	return f.Store.Deny(ctx, id, expires, reason)
}

func (f *FlakyStore) Deliver(ctx context.Context, id string, expires time.Time) (time.Time, error) {
	if err := f.err("Deliver"); err != nil {
		return time.Time{}, err
	}
	return f.Store.Deliver(ctx, id, expires)
}

func (f *FlakyStore) UseOnce(ctx context.Context, key string, expires time.Time) error {
	if err := f.err("UseOnce"); err != nil {
		return err
	}
	return f.Store.UseOnce(ctx, key, expires)
}

func (f *FlakyStore) AdmitPoll(ctx context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	if err := f.err("AdmitPoll"); err != nil {
		return err
	}
	return f.Store.AdmitPoll(ctx, id, nonce, expires, minInterval)
}

func (f *FlakyStore) Wait(ctx context.Context, id string) (sessions.Outcome, error) {
	if err := f.err("Wait"); err != nil {
		return sessions.Outcome{}, err
	}
	return f.Store.Wait(ctx, id)
}
