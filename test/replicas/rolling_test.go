package replicas

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/sessions/hashring"
	"github.com/kbprovider/backend/internal/testutil/await"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
	"github.com/kbprovider/backend/web"
)

// Sizes of TestRollingRestartAndCrash. Each role is given to this many
// sessions of every replica, so every replica owns sessions in every state
// when it is restarted or killed; the rest of the sessions are pending and
// polled throughout.
const (
	rollingSessions     = 200
	perOwnerLoggedIn    = 5 // logged in before the restart, Bind pressed during it
	perOwnerFlowDuring  = 5 // login and Bind both during the restart
	perOwnerCompleted   = 5 // bound before the restart, first fetched after it
	perOwnerFetched     = 5 // bound and fetched before, fetched again throughout
	perOwnerFresh       = 5 // created before, never polled until after the restart
	perOwnerChromium    = 1 // logged in with chromium just before its owner's SIGTERM, Bind clicked during the handover
	perOwnerKillEach    = 4 // for the crash: logged in, completed, fetched (made after the restart), and fresh ones
	rollingGracePeriod  = 10 * time.Minute
	rollingSessionTTL   = 15 * time.Minute
	rollingPollers      = 6
	rollingAwaitTimeout = 3 * time.Minute
)

type role string

const (
	rolePending     role = "pending"
	roleLoggedIn    role = "logged in"
	roleFlowDuring  role = "login and bind during the restart"
	roleCompleted   role = "completed, not fetched"
	roleFetched     role = "fetched within grace"
	roleFresh       role = "fresh"
	roleChromium    role = "bound in chromium during its owner's handover"
	roleKillLogged  role = "crash: logged in"
	roleKillDone    role = "crash: completed, not fetched"
	roleKillFetched role = "crash: fetched within grace"
	roleKillFresh   role = "crash: fresh"
)

// ringOwner is the owner of a session ID in a ring of members.
func ringOwner(members []string, id string) string { return hashring.OwnerOf(members, id) }

// ringBackup is the member that owns id when its owner is gone.
func ringBackup(members []string, id string) string {
	owner := ringOwner(members, id)
	return ringOwner(slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == owner }), id)
}

// tracked is a session as the test's client and browser hold it, with
// what the test knows of its state.
type tracked struct {
	*session
	owner string // name of the owning replica (the ring never changes for good)
	role  role

	// mu is held for each poll and each browser step, so what a poll must
	// answer follows from the fields below.
	mu        sync.Mutex
	held      bool     // not polled (fresh, or completed and kept unfetched)
	browser   *browser // logged in, on the selection page
	bound     bool     // Bind answered 200: every poll must give the response
	response  []byte   // the BindingResponse of the first fetch
	namespace string
	lastPoll  time.Time  // when the last accepted poll's answer came
	accepted  []*url.URL // signed polls the backend accepted: their nonces are spent
	gone      bool       // answered 410: lost
}

// pool stands for the Service in front of the replicas: the replicas in
// service, and a way to take one out that waits for requests in flight
// to it (what the preStop sleep achieves in a cluster).
type pool struct {
	mu   sync.RWMutex
	live []*replica
	next atomic.Uint64
}

// pick returns two different replicas in service (a and b may be equal
// with one replica); release must be called when the requests to them
// are done.
func (p *pool) pick() (a, b *replica, release func()) {
	p.mu.RLock()
	n := p.next.Add(1)
	a = p.live[n%uint64(len(p.live))]
	b = p.live[(n+1)%uint64(len(p.live))]
	return a, b, p.mu.RUnlock
}

func (p *pool) remove(r *replica) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keep []*replica
	for _, x := range p.live {
		if x != r {
			keep = append(keep, x)
		}
	}
	p.live = keep
}

func (p *pool) add(r *replica) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live = append(p.live, r)
}

// tally counts what went wrong, by kind, and keeps the first examples.
type tally struct {
	mu       sync.Mutex
	counts   map[string]int
	examples map[string][]string
	polls    atomic.Int64
	replays  atomic.Int64
	binds    atomic.Int64
}

func newTally() *tally {
	return &tally{counts: map[string]int{}, examples: map[string][]string{}}
}

const (
	badLost       = "sessions lost (410)"
	badResponse   = "responses lost or changed"
	badTwice      = "nonces accepted twice"
	bad5xx        = "5xx answers"
	badTransport  = "requests without an answer"
	badUnexpected = "other unexpected answers"
)

func (t *tally) bad(kind, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counts[kind]++
	if len(t.examples[kind]) < 8 {
		t.examples[kind] = append(t.examples[kind], fmt.Sprintf(format, args...))
	}
}

// report fails the test for every kind counted, with examples.
func (t *tally) report(tt *testing.T, phase string) {
	tt.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	tt.Logf("%s: %d polls, each replayed on another replica (%d replays), %d binds", phase, t.polls.Load(), t.replays.Load(), t.binds.Load())
	for _, kind := range []string{badLost, badResponse, badTwice, bad5xx, badTransport, badUnexpected} {
		if n := t.counts[kind]; n > 0 {
			tt.Errorf("%s: %d %s, e.g.:\n  %s", phase, n, kind, strings.Join(t.examples[kind], "\n  "))
		} else {
			tt.Logf("%s: 0 %s", phase, kind)
		}
	}
}

// rollingRig is the test's world: replicas, their Service, the identity
// provider and the client side.
type rollingRig struct {
	t      *testing.T
	ctx    context.Context
	cp     *controlplane.ControlPlane
	idp    *oidcprovider.Provider
	pool   *pool
	front  *httptest.Server
	tr     *http.Transport
	client *http.Client
	tally  atomic.Pointer[tally]

	mu       sync.Mutex
	sessions []*tracked // what the pollers poll (those not held)
}

// track adds sessions for the pollers.
func (rig *rollingRig) track(ts ...*tracked) {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	rig.sessions = append(rig.sessions, ts...)
}

// share is poller w's part of the sessions.
func (rig *rollingRig) share(w int) []*tracked {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	var out []*tracked
	for i := w; i < len(rig.sessions); i += rollingPollers {
		out = append(out, rig.sessions[i])
	}
	return out
}

// try sends a signed poll to replica r.
func (rig *rollingRig) try(r *replica, signed *url.URL) (pollAnswer, error) {
	u := *signed
	u.Scheme, u.Host = "http", r.addr
	req, err := http.NewRequestWithContext(rig.ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return pollAnswer{}, err
	}
	start := time.Now()
	resp, err := rig.client.Do(req)
	if err != nil {
		return pollAnswer{}, fmt.Errorf("poll on %s: %w", r.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return pollAnswer{}, fmt.Errorf("poll on %s: %w", r.name, err)
	}
	a := pollAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b, took: time.Since(start)}
	var e v1alpha1.Error
	if json.Unmarshal(b, &e) == nil {
		a.code, a.msg = e.Error, e.Message
	}
	return a, nil
}

// accepted says whether the backend processed a poll (and spent its nonce).
func accepted(a pollAnswer) bool {
	return a.status == http.StatusOK || (a.status == http.StatusForbidden && a.code == v1alpha1.ErrorAuthorizationPending)
}

// classify counts an answer that is not what it should be; it returns
// whether the answer was the expected one. want is "accepted" or
// "refused" (a spent nonce: 401 invalid_signature).
func (rig *rollingRig) classify(ts *tracked, what string, r *replica, a pollAnswer, err error, wantAccepted bool) bool {
	tl := rig.tally.Load()
	switch {
	case err != nil:
		tl.bad(badTransport, "%s %s: %v", ts.SessionID, what, err)
	case a.status >= 500:
		tl.bad(bad5xx, "%s %s on %s (owner %s): %s %s", ts.SessionID, what, r.name, ts.owner, a, a.body)
	case a.status == http.StatusGone:
		if !ts.gone {
			tl.bad(badLost, "%s (%s, owner %s) %s on %s: %s", ts.SessionID, ts.role, ts.owner, what, r.name, a)
		}
		ts.gone = true
	case wantAccepted && accepted(a):
		return true
	case !wantAccepted && a.status == http.StatusUnauthorized && a.code == v1alpha1.ErrorInvalidSignature:
		return true
	case !wantAccepted && accepted(a):
		tl.bad(badTwice, "%s (owner %s) %s on %s: %s", ts.SessionID, ts.owner, what, r.name, a)
	default:
		tl.bad(badUnexpected, "%s (%s, owner %s) %s on %s: %s %s", ts.SessionID, ts.role, ts.owner, what, r.name, a, a.body)
	}
	return false
}

// poll polls ts once on one replica in service and replays the same
// signed URL on another: at the same time (every other poll) or after the
// answer. Exactly one of the two may be accepted. Called with ts.mu held.
func (rig *rollingRig) poll(ts *tracked, concurrent bool) {
	tl := rig.tally.Load()
	signed := ts.signedPoll(rig.t)
	a, b, release := rig.pool.pick()
	var first, second pollAnswer
	var err1, err2 error
	if concurrent {
		var wg sync.WaitGroup
		wg.Go(func() { first, err1 = rig.try(a, signed) })
		second, err2 = rig.try(b, signed)
		wg.Wait()
	} else {
		first, err1 = rig.try(a, signed)
		second, err2 = rig.try(b, signed)
	}
	release()
	tl.polls.Add(1)
	tl.replays.Add(1)
	if err2 == nil && accepted(second) && (err1 != nil || !accepted(first)) {
		// The replay won the race, or the original failed without
		// spending the nonce: the replay is the one accepted use; judge
		// the other as the duplicate (its failure is counted as such).
		first, second, a, b = second, first, b, a
		err1, err2 = err2, err1
	}
	mode := "replay after the answer"
	if concurrent {
		mode = "replay at the same time"
	}
	if err1 == nil && err2 == nil && !accepted(first) && !accepted(second) && first.status == http.StatusUnauthorized && second.status == http.StatusUnauthorized {
		// Neither accepted, both "used before": the nonce was spent
		// without any answer accepting it. The client's fresh poll failed.
		tl.bad(badUnexpected, "%s (%s, owner %s): a fresh poll refused as a used nonce by both %s (%s, %s) and %s (%s, %s) (%s)",
			ts.SessionID, ts.role, ts.owner, a.name, first.msg, first.took, b.name, second.msg, second.took, mode)
		return
	}
	ok := rig.classify(ts, "poll ("+mode+")", a, first, err1, true)
	rig.classify(ts, "replayed poll ("+mode+")", b, second, err2, false)
	if !ok {
		return
	}
	ts.lastPoll = time.Now()
	ts.accepted = append(ts.accepted, signed)
	switch {
	case !ts.bound && first.status != http.StatusForbidden:
		tl.bad(badUnexpected, "%s (%s) not bound, poll on %s: %s", ts.SessionID, ts.role, a.name, first)
	case ts.bound && first.status != http.StatusOK:
		tl.bad(badResponse, "%s (%s, owner %s) bound, poll on %s: %s", ts.SessionID, ts.role, ts.owner, a.name, first)
	case ts.bound && ts.response == nil:
		var br v1alpha1.BindingResponse
		if err := json.Unmarshal(first.body, &br); err != nil {
			tl.bad(badResponse, "%s: BindingResponse: %v", ts.SessionID, err)
			return
		}
		res, err := pollclient.ValidateBindingResponse(&br, ts.SessionID)
		if err != nil || !strings.HasPrefix(res.Namespace, namespacePrefix) {
			tl.bad(badResponse, "%s: BindingResponse: %v, namespace %q", ts.SessionID, err, res.Namespace)
			return
		}
		ts.response, ts.namespace = first.body, res.Namespace
	case ts.bound && string(first.body) != string(ts.response):
		tl.bad(badResponse, "%s (owner %s): poll on %s within the grace period gave other bytes than the first fetch", ts.SessionID, ts.owner, a.name)
	}
}

// pollLoop polls poller w's share of the sessions until stop is closed,
// each session at most once per poll interval (plus a margin, so the
// backend never answers slow_down).
func (rig *rollingRig) pollLoop(w int, stop <-chan struct{}) {
	spacing := pollInterval + pollInterval/4
	for n := 0; ; n++ {
		polled := false
		for _, ts := range rig.share(w) {
			select {
			case <-stop:
				return
			default:
			}
			// A session in a browser step is polled in a later round.
			if !ts.mu.TryLock() {
				continue
			}
			if ts.held || ts.gone {
				ts.mu.Unlock()
				continue
			}
			if wait := time.Until(ts.lastPoll.Add(spacing)); wait > 0 {
				// The protocol's interval between two polls of a session,
				// not a guess at how long something takes.
				ts.mu.Unlock()
				select {
				case <-stop:
					return
				case <-time.After(wait):
				}
				if !ts.mu.TryLock() {
					continue
				}
			}
			if !ts.held && !ts.gone {
				rig.poll(ts, n%2 == 1)
				polled = true
			}
			ts.mu.Unlock()
		}
		if !polled {
			// Nothing to poll in this share yet (held sessions).
			select {
			case <-stop:
				return
			case <-time.After(pollInterval / 10):
			}
		}
	}
}

// browser is a user's browser (a cookie jar) on the API selection page of
// one session, driven over HTTP through the Service.
type browser struct {
	client *http.Client
	target *url.URL
	form   url.Values
}

// login does the browser part up to the selection page: the signed
// authentication URL on the Service, the login at the identity provider,
// the callback. Called with ts.mu held.
func (rig *rollingRig) login(ts *tracked) bool {
	tl := rig.tally.Load()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Transport: rig.tr, Timeout: 30 * time.Second}
	noFollow := *client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	page := func(what string, resp *http.Response, err error, want int) ([]byte, bool) {
		if err != nil {
			tl.bad(badTransport, "%s %s: %v", ts.SessionID, what, err)
			return nil, false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		switch {
		case resp.StatusCode == want:
			return b, true
		case resp.StatusCode >= 500:
			tl.bad(bad5xx, "%s (owner %s) %s: %d %s", ts.SessionID, ts.owner, what, resp.StatusCode, brief(b))
		case resp.StatusCode == http.StatusGone:
			if !ts.gone {
				tl.bad(badLost, "%s (%s, owner %s) %s: 410", ts.SessionID, ts.role, ts.owner, what)
			}
			ts.gone = true
		default:
			tl.bad(badUnexpected, "%s (owner %s) %s: %d %s", ts.SessionID, ts.owner, what, resp.StatusCode, brief(b))
		}
		return nil, false
	}
	resp, err := noFollow.Get(ts.authURL(rig.t))
	if _, ok := page("authentication URL", resp, err, http.StatusSeeOther); !ok {
		return false
	}
	callback, err := rig.idp.Login(rig.ctx, client, resp.Header.Get("Location"), alice.Name, alice.Password)
	if err != nil {
		tl.bad(badUnexpected, "%s: login at the identity provider: %v", ts.SessionID, err)
		return false
	}
	resp, err = client.Get(callback.String())
	b, ok := page("callback", resp, err, http.StatusOK)
	if !ok {
		return false
	}
	action, form := selectionForm(rig.t, b)
	if form.Get(web.FieldCSRF) == "" {
		tl.bad(badUnexpected, "%s: no selection form after the callback: %s", ts.SessionID, brief(b))
		return false
	}
	ts.browser = &browser{client: client, target: resp.Request.URL.ResolveReference(&url.URL{Path: action}), form: form}
	return true
}

// bind presses Bind on the selection page. Called with ts.mu held.
func (rig *rollingRig) bind(ts *tracked) bool {
	tl := rig.tally.Load()
	br := ts.browser
	ts.browser = nil
	form := bindForm(br.form)
	req, _ := http.NewRequestWithContext(rig.ctx, http.MethodPost, br.target.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", rig.front.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	tl.binds.Add(1)
	resp, err := br.client.Do(req)
	if err != nil {
		tl.bad(badTransport, "%s bind: %v", ts.SessionID, err)
		return false
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK && strings.Contains(strings.ToLower(string(page)), "terminal"):
		ts.bound = true
		return true
	case resp.StatusCode >= 500:
		tl.bad(bad5xx, "%s (owner %s) bind: %d %s", ts.SessionID, ts.owner, resp.StatusCode, brief(page))
	case resp.StatusCode == http.StatusGone:
		if !ts.gone {
			tl.bad(badLost, "%s (%s, owner %s) bind: 410", ts.SessionID, ts.role, ts.owner)
		}
		ts.gone = true
	default:
		tl.bad(badUnexpected, "%s (owner %s) bind: %d %s", ts.SessionID, ts.owner, resp.StatusCode, brief(page))
	}
	return false
}

// chromiumBind does the browser part of ts in chromium: the
// authentication URL, the login at the identity provider, the selection
// page; then before() (when not nil) and Bind. The page must say the bind
// is complete. Called with ts.mu held, on the test's goroutine.
func (rig *rollingRig) chromiumBind(b *chromium.Browser, ts *tracked, before func()) {
	t := rig.t
	t.Helper()
	tl := rig.tally.Load()
	if status := b.Open(ts.authURL(t)); status != http.StatusOK {
		tl.bad(badUnexpected, "%s: authentication URL in chromium led to %d at %s: %s", ts.SessionID, status, b.URL(), b.Text("body"))
		return
	}
	if b.Exists("#login") {
		b.Fill("#login", alice.Name)
		b.Fill("#password", alice.Password)
		b.Submit("button[type=submit]")
	}
	if b.Exists("form[action$='/confirm'] button") {
		b.ClickAndWait("form[action$='/confirm'] button")
	}
	if !strings.HasPrefix(b.URL(), rig.front.URL+"/bind") {
		tl.bad(badUnexpected, "%s: after the login chromium is at %s: %s", ts.SessionID, b.URL(), b.Text("body"))
		return
	}
	b.Click("input[value='" + exportedCRD + "']")
	b.Click("#confirm")
	if before != nil {
		before()
	}
	tl.binds.Add(1)
	status := b.ClickAndWait("button[value=bind]")
	done := b.Text("main")
	switch {
	case status == http.StatusOK && strings.Contains(strings.ToLower(done), "terminal"):
		ts.bound = true
	case status >= 500:
		tl.bad(bad5xx, "%s (owner %s) Bind in chromium: %d %s", ts.SessionID, ts.owner, status, done)
	case status == http.StatusGone:
		ts.gone = true
		tl.bad(badLost, "%s (%s, owner %s) Bind in chromium: 410 %s", ts.SessionID, ts.role, ts.owner, done)
	default:
		tl.bad(badUnexpected, "%s (owner %s) Bind in chromium: %d %s", ts.SessionID, ts.owner, status, done)
	}
}

// brief is the text of a page's first heading and paragraph, for reports.
func brief(page []byte) string {
	doc, err := html.Parse(strings.NewReader(string(page)))
	if err != nil {
		return fmt.Sprintf("%.200q", page)
	}
	var parts []string
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && (n.Data == "h1" || n.Data == "p") && len(parts) < 2 {
			var b strings.Builder
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type == html.TextNode {
					b.WriteString(c.Data)
				}
			}
			parts = append(parts, strings.Join(strings.Fields(b.String()), " "))
			return
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if len(parts) == 0 {
		return fmt.Sprintf("%.200q", page)
	}
	return strings.Join(parts, " / ")
}

// each runs fn for every session, on workers goroutines, and waits.
func each(sessions []*tracked, workers int, fn func(*tracked)) {
	work := make(chan *tracked)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ts := range work {
				ts.mu.Lock()
				fn(ts)
				ts.mu.Unlock()
			}
		})
	}
	for _, ts := range sessions {
		work <- ts
	}
	close(work)
	wg.Wait()
}

// awaitStopped expects a clean exit after SIGTERM within the chart's
// grace period: handover, drain, "stopped", exit 0, peer API closed.
func awaitStopped(t *testing.T, r *replica) {
	t.Helper()
	r.awaitStopped(t, 60*time.Second) // the chart's terminationGracePeriodSeconds
}

// TestRollingRestartAndCrash is issue 11's measure, with separate
// processes, the real API server and the real identity provider: three
// replicas in a hashring hold 200 sessions in every state; each replica in
// turn gets SIGTERM and a new process takes its place (same public address
// and peer URL) while polls and binds go on; every signed poll is also
// replayed on another replica. Then one replica is killed (SIGKILL). In
// both: no session lost, no response lost, no nonce accepted twice, no 5xx.
func TestRollingRestartAndCrash(t *testing.T) {
	began := time.Now()
	cp := controlplane.Get(t)
	prepareCluster(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	rig := &rollingRig{t: t, ctx: ctx, cp: cp, pool: &pool{}}
	rig.tr = &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(rig.tr.CloseIdleConnections)
	rig.client = &http.Client{Transport: rig.tr, Timeout: 30 * time.Second}
	rig.tally.Store(newTally())

	// The Service: each request to a replica in service, round robin.
	rig.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r, _, release := rig.pool.pick()
		defer release()
		(&httputil.ReverseProxy{Transport: rig.tr, Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: r.addr})
			pr.Out.Host = pr.In.Host
		}}).ServeHTTP(w, req)
	}))
	t.Cleanup(rig.front.Close)
	ext := rig.front.URL

	reps := []*replica{newReplica(t, "replica-0"), newReplica(t, "replica-1"), newReplica(t, "replica-2")}
	rig.idp = oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{ext + "/callback"}, Users: []oidcprovider.User{alice}})
	keys, peers := newRingKeys(t), peerURLs(reps)
	for _, r := range reps {
		r.args = append(r.ringArgs(keys, reps, ext, rig.idp, cp),
			"--grace-period", rollingGracePeriod.String(),
			"--session-ttl", rollingSessionTTL.String(),
			"--log-level", "info", // per-request debug lines of thousands of polls help nobody
		)
		r.start(t)
	}
	for _, r := range reps {
		r.waitReady(t)
		rig.pool.add(r)
	}
	t.Logf("three replicas ready after %s", time.Since(began).Round(time.Millisecond))

	// 200 sessions, created on every replica in turn, sorted by owner; the
	// roles go round each owner's sessions, so every replica owns sessions
	// in every state.
	nameOf := map[string]string{}
	for _, r := range reps {
		nameOf[r.peerURL] = r.name
	}
	byOwner := map[string][]*tracked{}
	var all []*tracked
	// Each replica must own enough for every role and some pending ones;
	// a session the test does not need (its owner has enough and the rest
	// is needed by another) is left alone, untracked.
	minPerOwner := perOwnerLoggedIn + perOwnerFlowDuring + perOwnerCompleted + perOwnerFetched + perOwnerFresh +
		perOwnerChromium + 3*perOwnerKillEach + 5
	needed := func() int {
		n := 0
		for _, r := range reps {
			n += max(0, minPerOwner-len(byOwner[r.name]))
		}
		return n
	}
	for i := 0; len(all) < rollingSessions; i++ {
		if i == 10*rollingSessions {
			t.Fatalf("%d sessions made and still not %d owned by each replica", i, minPerOwner)
		}
		s := mustCreate(t, reps[i%3], ext, "")
		ts := &tracked{session: s, owner: nameOf[ringOwner(peers, s.SessionID)], role: rolePending}
		if len(byOwner[ts.owner]) >= minPerOwner && rollingSessions-len(all) <= needed() {
			continue
		}
		byOwner[ts.owner] = append(byOwner[ts.owner], ts)
		all = append(all, ts)
	}
	roles := []struct {
		role role
		n    int
	}{{roleLoggedIn, perOwnerLoggedIn}, {roleFlowDuring, perOwnerFlowDuring}, {roleCompleted, perOwnerCompleted},
		{roleFetched, perOwnerFetched}, {roleFresh, perOwnerFresh}, {roleChromium, perOwnerChromium}}
	withRole := map[role][]*tracked{}
	for _, r := range reps {
		owned := byOwner[r.name]
		i := 0
		for _, x := range roles {
			for range x.n {
				if i == len(owned) {
					t.Fatalf("%s owns only %d of %d sessions", r.name, len(owned), rollingSessions)
				}
				owned[i].role = x.role
				i++
			}
		}
		for _, ts := range owned {
			withRole[ts.role] = append(withRole[ts.role], ts)
		}
		t.Logf("%s owns %d sessions", r.name, len(owned))
	}

	// The real browser, started now so its start is not part of the restart.
	b := chromium.New(t)
	b.AutoScreenshot = false // thousands of polls; a failure still gets its screenshot

	// Before the restart: logged in; bound; bound and fetched; fresh ones
	// are held back from the pollers.
	for _, ts := range withRole[roleFresh] {
		ts.held = true
	}
	prep := time.Now()
	each(append(append(append([]*tracked{}, withRole[roleLoggedIn]...), withRole[roleCompleted]...), withRole[roleFetched]...), 3, func(ts *tracked) {
		if !rig.login(ts) || ts.role == roleLoggedIn {
			return
		}
		rig.bind(ts)
		switch ts.role {
		case roleCompleted:
			ts.held = true
		case roleFetched:
			rig.poll(ts, false)
		}
	})
	rig.tally.Load().report(t, "setup")
	if t.Failed() {
		t.FailNow()
	}
	for _, ts := range withRole[roleFetched] {
		if ts.response == nil {
			t.Fatalf("session %s: bound before the restart but not fetched", ts.SessionID)
		}
	}
	t.Logf("setup of %d sessions (%d binds) took %s", len(all), rig.tally.Load().binds.Load(), time.Since(prep).Round(time.Millisecond))

	// The pollers run from here to the end.
	stopPolls := make(chan struct{})
	var pollers sync.WaitGroup
	rig.track(all...)
	for w := range rollingPollers {
		pollers.Go(func() { rig.pollLoop(w, stopPolls) })
	}
	stopPolling := sync.OnceFunc(func() { close(stopPolls); pollers.Wait() })
	defer stopPolling()

	// Every session not held back polled at least once since since (that
	// poll, a nonce use, reached the owner's current backup), and every
	// bound one fetched; or gone.
	allPolledSince := func(what string, since time.Time, sessions []*tracked) {
		t.Helper()
		await.Within(t, rollingAwaitTimeout, 50*time.Millisecond, what, func() (bool, error) {
			for _, ts := range sessions {
				ts.mu.Lock()
				ok := ts.gone || ts.held || (ts.lastPoll.After(since) && (!ts.bound || ts.response != nil))
				ts.mu.Unlock()
				if !ok {
					return false, fmt.Errorf("session %s (%s, owner %s) not polled since", ts.SessionID, ts.role, ts.owner)
				}
			}
			return true, nil
		})
	}
	allPolledSince("every session polled before the restart", time.Now(), all)
	rig.tally.Load().report(t, "before the restart")
	rig.tally.Store(newTally())

	// The rolling restart, replica by replica: the Service stops sending it
	// requests (after those in flight), SIGTERM, a new process at the same
	// addresses, ready, back in the Service. Meanwhile binds: a third of
	// the logged-in sessions press Bind, a third of the flow ones do the
	// whole browser part.
	restart := time.Now()
	var binders sync.WaitGroup
	batch := func(sessions []*tracked, i int) []*tracked {
		var out []*tracked
		for j := i; j < len(sessions); j += 3 {
			out = append(out, sessions[j])
		}
		return out
	}
	for i, old := range reps {
		batchLogged, batchFlow := batch(withRole[roleLoggedIn], i), batch(withRole[roleFlowDuring], i)
		binders.Go(func() {
			each(append(append([]*tracked{}, batchLogged...), batchFlow...), 2, func(ts *tracked) {
				if ts.browser == nil && !rig.login(ts) {
					return
				}
				rig.bind(ts)
			})
		})
		// In chromium, a session of this replica reaches the selection page.
		var inBrowser []*tracked
		for _, ts := range withRole[roleChromium] {
			if ts.owner == nameOf[old.peerURL] {
				inBrowser = append(inBrowser, ts)
			}
		}
		for i := 1; i < len(inBrowser); i++ {
			ts := inBrowser[i]
			ts.mu.Lock()
			rig.chromiumBind(b, ts, nil)
			ts.mu.Unlock()
		}
		rig.pool.remove(old)
		rig.tr.CloseIdleConnections()
		stopAt := time.Now()
		// SIGTERM, and the user presses Bind while the replica hands over.
		if len(inBrowser) > 0 {
			ts := inBrowser[0]
			ts.mu.Lock()
			rig.chromiumBind(b, ts, func() {
				stopAt = time.Now()
				old.cmd.Process.Signal(syscall.SIGTERM)
			})
			ts.mu.Unlock()
		} else {
			old.cmd.Process.Signal(syscall.SIGTERM)
		}
		awaitStopped(t, old)
		stopped := time.Since(stopAt)
		next := &replica{name: old.name + "'", addr: old.addr, peerURL: old.peerURL, args: old.args}
		next.start(t)
		next.waitReady(t)
		rig.pool.add(next)
		reps[i] = next
		t.Logf("%s: SIGTERM to exit %s (Bind in chromium meanwhile), new process ready %s later", old.name, stopped.Round(time.Millisecond), (time.Since(stopAt) - stopped).Round(time.Millisecond))
	}
	binders.Wait()
	stable := time.Now()
	for _, r := range reps {
		if code, body, _ := r.readyz(); code != http.StatusOK {
			t.Errorf("%s not ready after the restart: %d %s", r.name, code, body)
		}
	}
	// The completed sessions kept back, and the fresh ones, are polled now:
	// the responses are there, the fresh sessions pending.
	for _, ts := range append(append([]*tracked{}, withRole[roleCompleted]...), withRole[roleFresh]...) {
		ts.mu.Lock()
		ts.held = false
		ts.mu.Unlock()
	}
	allPolledSince("every session polled after the restart, every bound one fetched", stable, all)
	t.Logf("rolling restart and the checks after it took %s", time.Since(restart).Round(time.Millisecond))

	// Nonces spent before or during the restart stay spent: replay up to
	// three accepted polls of every session on a replica.
	replayOld := func(sessions []*tracked) {
		t.Helper()
		n := 0
		for _, ts := range sessions {
			ts.mu.Lock()
			urls := ts.accepted
			if len(urls) > 3 {
				urls = []*url.URL{urls[0], urls[len(urls)/2], urls[len(urls)-2]}
			}
			for _, u := range urls {
				a, _, release := rig.pool.pick()
				ans, err := rig.try(a, u)
				release()
				rig.classify(ts, "old poll replayed", a, ans, err, false)
				n++
			}
			ts.mu.Unlock()
		}
		t.Logf("replayed %d accepted polls", n)
	}
	replayOld(all)
	rig.tally.Load().report(t, "rolling restart")
	rig.tally.Store(newTally())
	assertNamespaces(t, rig, all)

	// The crash. Sessions made or changed after the ring settled reached
	// their backup: new fresh sessions, logins, binds and fetches now.
	fresh := map[string]int{}
	for i := 0; ; i++ {
		done := true
		for _, r := range reps {
			if fresh[nameOf[r.peerURL]] < perOwnerKillEach {
				done = false
			}
		}
		if done {
			break
		}
		if i == 30*perOwnerKillEach {
			t.Fatalf("%d new sessions and still not %d owned by each replica: %v", i, perOwnerKillEach, fresh)
		}
		s := mustCreate(t, reps[i%3], ext, "")
		owner := nameOf[ringOwner(peers, s.SessionID)]
		if fresh[owner] >= perOwnerKillEach {
			continue
		}
		fresh[owner]++
		ts := &tracked{session: s, owner: owner, role: roleKillFresh, held: true}
		withRole[roleKillFresh] = append(withRole[roleKillFresh], ts)
		all = append(all, ts)
		rig.track(ts)
	}
	var convert []*tracked
	for _, r := range reps {
		n := 0
		for _, ts := range all {
			if ts.owner == nameOf[r.peerURL] && ts.role == rolePending && !ts.gone && n < 3*perOwnerKillEach {
				ts.mu.Lock()
				ts.role = []role{roleKillLogged, roleKillDone, roleKillFetched}[n%3]
				ts.mu.Unlock()
				withRole[ts.role] = append(withRole[ts.role], ts)
				convert = append(convert, ts)
				n++
			}
		}
	}
	each(convert, 3, func(ts *tracked) {
		if !rig.login(ts) || ts.role == roleKillLogged {
			return
		}
		rig.bind(ts)
		if ts.role == roleKillDone {
			ts.held = true
		}
	})
	settled := time.Now()
	allPolledSince("every session polled after the ring settled", settled, all)

	victim := reps[1]
	var victims []*tracked
	backedUp := 0
	for _, ts := range all {
		if ts.owner == nameOf[victim.peerURL] && !ts.gone {
			victims = append(victims, ts)
		}
		if ringBackup(peers, ts.SessionID) == victim.peerURL && !ts.gone {
			backedUp++
		}
	}
	rig.pool.remove(victim)
	rig.tr.CloseIdleConnections()
	killedAt := time.Now()
	victim.kill(t)
	t.Logf("killed %s, which owned %d live sessions and held the backup copies of %d", victim.name, len(victims), backedUp)
	// Binds go on: the logged-in sessions press Bind (those of the victim
	// at its backup).
	each(withRole[roleKillLogged], 2, func(ts *tracked) {
		if ts.browser != nil {
			rig.bind(ts)
		}
	})
	for _, ts := range append(append([]*tracked{}, withRole[roleKillDone]...), withRole[roleKillFresh]...) {
		ts.mu.Lock()
		ts.held = false
		ts.mu.Unlock()
	}
	allPolledSince("every session polled after the crash, every bound one fetched", killedAt, all)
	replayOld(all)
	for _, r := range []*replica{reps[0], reps[2]} {
		if code, body, _ := r.readyz(); code != http.StatusOK {
			t.Errorf("%s not ready after %s died: %d %s", r.name, victim.name, code, body)
		}
	}
	stopPolling()
	tl := rig.tally.Load()
	tl.report(t, "crash")
	assertNamespaces(t, rig, all)

	counts := map[role]int{}
	lostVictims := 0
	for _, ts := range all {
		counts[ts.role]++
	}
	for _, ts := range victims {
		if ts.gone {
			lostVictims++
		}
	}
	var lines []string
	for r, n := range counts {
		lines = append(lines, fmt.Sprintf("%s: %d", r, n))
	}
	sort.Strings(lines)
	t.Logf("sessions by role (%d in all): %s", len(all), strings.Join(lines, "; "))
	t.Logf("%d of the %d live sessions the killed replica owned were lost", lostVictims, len(victims))
	t.Logf("wall time %s", time.Since(began).Round(time.Millisecond))
}

// assertNamespaces checks that every fetched response names a namespace
// provisioned for that session's cluster, and that every session bound
// got one.
func assertNamespaces(t *testing.T, rig *rollingRig, sessions []*tracked) {
	t.Helper()
	nss, err := kubernetes.NewForConfigOrDie(rig.cp.AdminConfig()).CoreV1().Namespaces().List(rig.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cluster := map[string]string{}
	for _, n := range nss.Items {
		cluster[n.Name] = n.Annotations[binding.AnnotationCluster]
	}
	bound := 0
	for _, ts := range sessions {
		ts.mu.Lock()
		if ts.bound {
			bound++
			if ts.response == nil && !ts.gone {
				t.Errorf("session %s (%s): bound, response never fetched", ts.SessionID, ts.role)
			}
		}
		if ts.response != nil && cluster[ts.namespace] != ts.ClusterID {
			t.Errorf("session %s: response names namespace %q, which belongs to cluster %q, not %q", ts.SessionID, ts.namespace, cluster[ts.namespace], ts.ClusterID)
		}
		ts.mu.Unlock()
	}
	t.Logf("%d sessions bound, each response naming the namespace provisioned for its cluster", bound)
}
