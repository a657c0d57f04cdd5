// Package longpoll decides which polls may be held open, and for how long:
// a client asks with the header "Prefer: wait=N" (RFC 7240, N in seconds)
// to have a poll of a pending session answered as soon as the session
// completes or is denied, or after N seconds (docs/long-polling.md).
//
// A Holder caps the wait at its MaxWait, holds at most MaxHeld polls at
// once (beyond that a poll is answered at once, as without the header),
// and releases every held poll when the server starts shutting down.
package longpoll

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
)

// Defaults of the backend's flags.
const (
	DefaultMaxWait = 30 * time.Second
	DefaultMaxHeld = 1000
	// UpperMaxWait bounds MaxWait: a held poll must end well within the
	// public server's 60s write timeout, and within the 60s idle timeout
	// common in proxies and load balancers in front of it.
	UpperMaxWait = 50 * time.Second
)

// Options configure long polling; the zero value turns it off.
type Options struct {
	// MaxWait caps what a client may ask for (--long-poll-max-wait); 0
	// turns long polling off: the header is ignored and discovery does
	// not advertise it.
	MaxWait time.Duration
	// MaxHeld is the most polls held at once by this replica
	// (--max-long-polls).
	MaxHeld int
}

// AddFlags registers the flags, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.MaxWait, "long-poll-max-wait", DefaultMaxWait, "longest a poll that asks with \"Prefer: wait=N\" is held until its session ends (whole seconds, at most 50s); advertised in discovery as longPollMaxWait; 0 turns long polling off")
	fs.IntVar(&o.MaxHeld, "max-long-polls", DefaultMaxHeld, "most polls held open at once, per replica; beyond it a poll that asks to wait is answered at once")
}

// Validate checks the options; errors name the flags.
func (o Options) Validate() []error {
	var errs []error
	if o.MaxWait < 0 || o.MaxWait > UpperMaxWait || o.MaxWait%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--long-poll-max-wait %s: want whole seconds from 0 (off) to %s", o.MaxWait, UpperMaxWait))
	}
	if o.MaxHeld <= 0 {
		errs = append(errs, fmt.Errorf("--max-long-polls %d: must be positive (turn long polling off with --long-poll-max-wait=0)", o.MaxHeld))
	}
	return errs
}

// Holder holds long polls. A nil *Holder holds none (long polling off).
type Holder struct {
	maxWait time.Duration
	// slots has one token per poll that may be held.
	slots chan struct{}
	// shutdown ends when Release is called.
	shutdown context.Context
	release  context.CancelFunc
	refused  atomic.Int64
}

// New returns a Holder for validated options, or nil when o.MaxWait is 0.
func New(o Options) *Holder {
	if o.MaxWait <= 0 {
		return nil
	}
	shutdown, release := context.WithCancel(context.Background())
	return &Holder{
		maxWait:  o.MaxWait,
		slots:    make(chan struct{}, o.MaxHeld),
		shutdown: shutdown,
		release:  release,
	}
}

// MaxWait is the longest wait granted, 0 when long polling is off.
func (h *Holder) MaxWait() time.Duration {
	if h == nil {
		return 0
	}
	return h.maxWait
}

// Wanted returns how long the request asks to be held, capped at MaxWait;
// ok is false when it asks for no wait (no or a malformed preference,
// wait=0) or long polling is off.
func (h *Holder) Wanted(header http.Header) (d time.Duration, ok bool) {
	if h == nil {
		return 0, false
	}
	secs, ok := PreferWait(header.Values("Prefer"))
	if !ok || secs == 0 {
		return 0, false
	}
	if max := int64(h.maxWait / time.Second); secs > max {
		secs = max
	}
	return time.Duration(secs) * time.Second, true
}

// Hold takes one of the slots for a poll held for d: ctx ends after d,
// when the poll's own context ends, or when Release is called. done frees
// the slot; call it when the poll is answered (more calls do nothing). ok is false when every slot
// is taken or shutdown began: answer at once.
func (h *Holder) Hold(parent context.Context, d time.Duration) (ctx context.Context, done func(), ok bool) {
	if h == nil {
		return nil, nil, false
	}
	if h.shutdown.Err() != nil {
		return nil, nil, false
	}
	select {
	case h.slots <- struct{}{}:
	default:
		h.refused.Add(1)
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(parent, d)
	// Shutdown ends the held poll (no goroutine until it does).
	stop := context.AfterFunc(h.shutdown, cancel)
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			stop()
			cancel()
			<-h.slots
		})
	}, true
}

// Release ends every held poll (they are answered as pending) and makes
// Hold refuse from now on: call it when shutdown begins, before the server
// drains its requests. Safe to call more than once.
func (h *Holder) Release() {
	if h == nil {
		return
	}
	h.release()
}

// Held is how many polls are held now.
func (h *Holder) Held() int {
	if h == nil {
		return 0
	}
	return len(h.slots)
}

// Refused counts the polls that asked to be held when every slot was
// taken.
func (h *Holder) Refused() int64 {
	if h == nil {
		return 0
	}
	return h.refused.Load()
}

// Applied is the Preference-Applied header value for a poll held for d.
func Applied(d time.Duration) string {
	return "wait=" + strconv.FormatInt(int64(d/time.Second), 10)
}
