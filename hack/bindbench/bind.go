package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/pollclient"
	"github.com/kbprovider/backend/web"
)

// binder does binds as a user and kube-bind-poll do them, each against
// two replicas: the session is created and polled on one, the browser
// part (authentication URL, login, callback, selection page, Bind) goes
// to the other, so the poll hears of the outcome across the ring.
type binder struct {
	idp   *oidcprovider.Provider
	users []oidcprovider.User
	// Per replica: a transport that sends the external URL's requests
	// to it, the poll client over it and the provider it discovered.
	transports []*http.Transport
	polls      []*pollclient.Client
	providers  []*pollclient.Provider
	timeout    time.Duration
}

func newBinder(ctx context.Context, e *env, longPoll bool, timeout time.Duration) (*binder, error) {
	b := &binder{idp: e.idp, users: e.users, timeout: timeout}
	ext, err := url.Parse(externalURL)
	if err != nil {
		return nil, err
	}
	extHost := ext.Host + ":80"
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	for _, r := range e.reps {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr == extHost {
					addr = r.addr
				}
				return dialer.DialContext(ctx, network, addr)
			},
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     30 * time.Second,
		}
		// Long polls are held up to 30 s; the client's timeout leaves
		// pollclient its slack above that.
		pc := pollclient.New(&http.Client{Transport: tr, Timeout: time.Minute})
		p, err := pc.Discover(ctx, externalURL+"/export")
		if err != nil {
			return nil, fmt.Errorf("discovery on %s: %w", r.name, err)
		}
		if !longPoll {
			p.LongPollMaxWait = 0
		}
		b.transports = append(b.transports, tr)
		b.polls = append(b.polls, pc)
		b.providers = append(b.providers, p)
	}
	return b, nil
}

// bindResult is one bind's outcome.
type bindResult struct {
	// ready: from submitting Bind until the poll got the
	// BindingResponse; whole: from creating the session until then.
	ready, whole time.Duration
	err          error
}

// stageError is a bind that failed at one step.
type stageError struct {
	stage  string
	status int // HTTP status, 0 if none
	err    error
}

func (e *stageError) Error() string {
	if e.status != 0 {
		return fmt.Sprintf("%s: %d: %v", e.stage, e.status, e.err)
	}
	return fmt.Sprintf("%s: %v", e.stage, e.err)
}

func (e *stageError) Unwrap() error { return e.err }

func failed(stage string, status int, err error) error {
	return &stageError{stage: stage, status: status, err: err}
}

// errorClass sums a failed bind up for counting: its step and the HTTP
// status or kind of network failure.
func errorClass(err error) string {
	stage, what := "bind", "error"
	var se *stageError
	if errors.As(err, &se) {
		stage = se.stage
		if se.status != 0 {
			what = fmt.Sprint(se.status)
		}
	}
	var srv *pollclient.ServerError
	var ne net.Error
	switch {
	case errors.As(err, &srv):
		what = fmt.Sprint(srv.StatusCode)
		if srv.Code != "" {
			what += " " + srv.Code
		}
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		what = "timeout"
	case errors.Is(err, context.Canceled):
		what = "cancelled"
	case errors.Is(err, syscall.ECONNREFUSED):
		what = "connection refused"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		what = "connection reset"
	case errors.Is(err, oidcprovider.ErrLoginRefused):
		what = "login refused"
	case errors.Is(err, pollclient.ErrInvalidResponse):
		what = "invalid response"
	}
	return stage + ": " + what
}

// bind does bind number i: user i mod users; Bind on replica i mod 2,
// the session and its polls on the other.
func (b *binder) bind(ctx context.Context, i int) bindResult {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	user := b.users[i%len(b.users)]
	browserRep, pollRep := i%2, (i+1)%2
	start := time.Now()

	sess, err := b.polls[pollRep].CreateSession(ctx, b.providers[pollRep], "")
	if err != nil {
		return bindResult{err: failed("create session", 0, err)}
	}
	// The client polls from the start, as kube-bind-poll does while the
	// user is in the browser.
	type waited struct {
		at  time.Time
		err error
	}
	done := make(chan waited, 1)
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	go func() {
		_, err := sess.Wait(pollCtx)
		done <- waited{time.Now(), err}
	}()
	fail := func(err error) bindResult {
		stopPolling()
		<-done
		return bindResult{err: err}
	}

	authURL, err := sess.AuthenticationURL()
	if err != nil {
		return fail(failed("authentication URL", 0, err))
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		return fail(err)
	}
	browser := &http.Client{Jar: jar, Transport: b.transports[browserRep], Timeout: b.timeout}
	callback, err := b.idp.Login(ctx, browser, authURL, user.Name, user.Password)
	if err != nil {
		return fail(failed("login", 0, err))
	}
	target, fields, err := selectionForm(ctx, browser, callback.String())
	if err != nil {
		return fail(err)
	}
	submitted := time.Now()
	if err := submitBind(ctx, browser, target, fields); err != nil {
		return fail(err)
	}
	w := <-done
	if w.err != nil {
		return bindResult{err: failed("poll", 0, w.err)}
	}
	return bindResult{ready: w.at.Sub(submitted), whole: w.at.Sub(start)}
}

// selectionForm follows the identity provider's redirect to the callback
// and returns the selection page's form: where it posts to and its
// fields.
func selectionForm(ctx context.Context, browser *http.Client, callback string) (*url.URL, url.Values, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, callback, nil)
	if err != nil {
		return nil, nil, failed("callback", 0, err)
	}
	resp, err := browser.Do(req)
	if err != nil {
		return nil, nil, failed("callback", 0, err)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return nil, nil, failed("callback", 0, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, failed("callback", resp.StatusCode, fmt.Errorf("at %s: %.200s", resp.Request.URL, page))
	}
	forms, err := testutil.ParseForms(page)
	if err != nil {
		return nil, nil, failed("selection page", 0, err)
	}
	for _, f := range forms {
		if f.Method == http.MethodPost && f.Fields.Get(web.FieldCSRF) != "" {
			target, err := resp.Request.URL.Parse(f.Action)
			if err != nil {
				return nil, nil, failed("selection page", 0, err)
			}
			return target, f.Fields, nil
		}
	}
	return nil, nil, failed("selection page", 0, fmt.Errorf("no selection form at %s", resp.Request.URL))
}

// submitBind ticks the exported API, confirms, and presses Bind, as the
// browser sends it; the answer must be the page that sends the user back
// to the terminal.
func submitBind(ctx context.Context, browser *http.Client, target *url.URL, fields url.Values) error {
	form := url.Values{}
	for k, v := range fields {
		form[k] = v
	}
	form.Add(web.FieldAPI, exported.Name())
	form.Set(web.FieldAction, web.ActionBind)
	form.Set(web.FieldConfirm, web.ConfirmYes)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), strings.NewReader(form.Encode()))
	if err != nil {
		return failed("Bind", 0, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", externalURL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := browser.Do(req)
	if err != nil {
		return failed("Bind", 0, err)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return failed("Bind", 0, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(strings.ToLower(string(page)), "terminal") {
		return failed("Bind", resp.StatusCode, fmt.Errorf("not the page that sends the user back: %.200s", page))
	}
	return nil
}
