package replicas

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// outageWindow is how long a replica stays frozen or cut off (at least):
// past the peers' HTTP/2 ping timeout (10 s + 1 s), so both the
// connections that were open and the ones dialled anew are covered.
const outageWindow = 20 * time.Second

// How long the victim's sessions are polled after the outage: a thawed
// replica reads what waited in its sockets at once, but TCP retransmits
// what the peers sent to a cut-off one up to many seconds after the path
// is open again.
const (
	afterFrozen  = 3 * time.Second
	afterDropped = 12 * time.Second
)

// TestFrozenReplica: one of three replicas is stopped (SIGSTOP) for 20 s,
// as a stalled node: its sockets stay open, nothing answers. The other two
// answer every poll of its sessions within 5 s (never 503), the users of
// its sessions bind through them and the clients get their responses.
// Thawed, it answers again.
func TestFrozenReplica(t *testing.T) {
	c := newCluster(t, clusterOpts{replicas: 3})
	victim := c.reps[2]
	outage(t, c, victim, "frozen", afterFrozen,
		func() { victim.freeze(t) },
		func() { victim.thaw(t) })
}

// TestDroppedPeerTraffic: each replica has its own loopback address; nft
// drops every TCP packet to one replica's peer port (on its address only),
// so the others' requests to it time out instead of being refused. They
// answer its sessions within 5 s, as with a frozen replica; the replica
// itself stays up and reaches the others. When the packets flow again, a
// client polling a poll interval apart still never gets 429, also while
// TCP delivers, late, the admit requests that were stuck on the way (the
// owner must not take them for new polls). The nft table is removed at
// the end.
// requireNFTEnv, when set, makes TestDroppedPeerTraffic fail instead of
// skipping where it cannot drop packets (hack/test.sh sets it).
const requireNFTEnv = "KUBE_BIND_TEST_REQUIRE_NFT"

func TestDroppedPeerTraffic(t *testing.T) {
	// hack/test.sh installs nft and runs as root: there, a missing part is
	// a failure, not a skip nobody would see.
	cannot := t.Skipf
	if os.Getenv(requireNFTEnv) != "" {
		cannot = t.Fatalf
	}
	if os.Geteuid() != 0 {
		cannot("dropping packets with nft needs root")
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		cannot("nft is not installed (hack/install-test-deps.sh installs nftables)")
	}
	table := fmt.Sprintf("kbtest%d", os.Getpid())
	run := func(args ...string) (string, error) {
		out, err := exec.Command(nft, args...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("add", "table", "inet", table); err != nil {
		cannot("nft cannot add a table here (%v: %s)", err, strings.TrimSpace(out))
	}
	var once sync.Once
	remove := func() {
		once.Do(func() {
			if out, err := run("delete", "table", "inet", table); err != nil {
				t.Errorf("nft delete table inet %s: %v: %s", table, err, out)
			}
			out, err := run("list", "tables")
			if err != nil {
				t.Errorf("nft list tables: %v: %s", err, out)
			} else if strings.Contains(out, table) {
				t.Errorf("nft still lists table %s:\n%s", table, out)
			}
		})
	}
	t.Cleanup(remove)

	c := newCluster(t, clusterOpts{replicas: 3, hosts: []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}})
	victim := c.reps[2]
	host, port, _ := net.SplitHostPort(victim.peerAddr)
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Fatalf("refusing to drop packets to %s: not a loopback address", host)
	}
	rules := fmt.Sprintf(`table inet %[1]s {
	chain output {
		type filter hook output priority 0; policy accept;
		ip daddr %[2]s tcp dport %[3]s drop
	}
	chain input {
		type filter hook input priority 0; policy accept;
		ip daddr %[2]s tcp dport %[3]s drop
	}
}
`, table, host, port)
	outage(t, c, victim, "cut off (its peer port drops packets)", afterDropped,
		func() {
			cmd := exec.Command(nft, "-f", "-")
			cmd.Stdin = strings.NewReader(rules)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft -f: %v: %s\n%s", err, out, rules)
			}
			t.Logf("nft drops tcp to %s:%s (table inet %s)", host, port, table)
		},
		remove)
	// The replica itself stayed up all along.
	if code, body, err := victim.readyz(); code != http.StatusOK {
		t.Errorf("%s not ready after the outage: %d %s %v", victim.name, code, body, err)
	}
}

// outage runs the scenario of a replica that stops answering its peers
// (cut, then heal): before the cut, sessions it owns are bound, opened in
// the browser, or polled; during it, for outageWindow, a client polls its
// pending sessions through the others while users bind, and every answer
// comes within the bounds; after it, it answers again.
func outage(t *testing.T, c *cluster, victim *replica, how string, afterWindow time.Duration, cut, heal func()) {
	var others []*replica
	for _, r := range c.reps {
		if r != victim {
			others = append(others, r)
		}
	}
	// Sessions owned by the victim (and one owned by each other replica),
	// created on every replica.
	byOwner := map[*replica][]*session{}
	enough := func() bool {
		return len(byOwner[victim]) >= 5 && len(byOwner[others[0]]) >= 1 && len(byOwner[others[1]]) >= 1
	}
	for i := 0; !enough(); i++ {
		if i == 300 {
			t.Fatalf("300 sessions and still not 5 owned by %s", victim.name)
		}
		s := c.create(t, c.reps[i%len(c.reps)])
		o := ownerOf(c.reps, s.SessionID)
		byOwner[o] = append(byOwner[o], s)
	}
	vs := byOwner[victim]
	boundBefore, loggedIn, fresh, pending := vs[0], vs[1], vs[2], vs[3:5]
	polled := []*session{byOwner[others[0]][0], byOwner[others[1]][0], pending[0], pending[1]}
	c.bindVia(t, boundBefore, c.reps[0], others[1])
	c.f.pin(victim)
	sel := c.openSelection(t, loggedIn)
	// Polled once everywhere before the cut, so every replica has
	// connections to the victim's peer API.
	for _, r := range c.reps {
		for _, s := range polled {
			expect(t, "poll before the cut", c.poll(r, s), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
		}
		time.Sleep(pollGap)
	}

	cut()
	cutAt := time.Now()
	t.Logf("%s %s, which owns %d of the test's sessions", victim.name, how, len(vs))
	// Answers to polls of the victim's sessions, and of the others'.
	polls, othersPolls := &latencies{}, &latencies{}
	// check records a poll answered during the outage: the answer wanted,
	// within answerWithin. (Called by the poller too: Errorf only.)
	check := func(what string, r *replica, s *session, a pollAnswer, status int, code string) bool {
		if ownerOf(c.reps, s.SessionID) == victim {
			polls.add(a.took)
		} else {
			othersPolls.add(a.took)
		}
		if a.err != nil || a.status != status || a.code != code {
			t.Errorf("%s of %s on %s, %s into the outage: %s; want %d %s", what, s.SessionID, r.name, time.Since(cutAt).Round(time.Millisecond), a, status, code)
			return false
		} else if a.took > answerWithin {
			t.Errorf("%s of %s on %s: answered after %s, want within %s", what, s.SessionID, r.name, a.took, answerWithin)
		}
		return true
	}
	// deliver: pending until the outcome is read, then the response.
	deliver := func(what string, r *replica, s *session) {
		t.Helper()
		for deadline := time.Now().Add(answerWithin); ; time.Sleep(pollGap) {
			a := c.poll(r, s)
			if a.pending() && time.Now().Before(deadline) {
				check(what, r, s, a, a.status, a.code)
				continue
			}
			if check(what, r, s, a, http.StatusOK, "") {
				c.checkResponse(t, s, a.body)
			}
			return
		}
	}

	// A client polls the pending sessions through the others, a poll gap
	// apart, all through the outage.
	stop := make(chan struct{})
	var poller sync.WaitGroup
	rounds := 0
	poller.Go(func() {
		for ; ; rounds++ {
			for j, s := range polled {
				r := others[(rounds+j)%2]
				check("poll of a pending session", r, s, c.poll(r, s), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
			}
			select {
			case <-stop:
				return
			case <-time.After(pollGap):
			}
		}
	})

	// Bound before the cut, first polled now.
	deliver("poll of a session bound before the cut", others[0], boundBefore)
	// On the selection page (served by the victim) before the cut: Bind
	// through another replica now, then the response.
	binds, flows := &latencies{}, &latencies{}
	c.f.pin(others[0])
	begin := time.Now()
	c.mustBind(t, sel)
	binds.add(time.Since(begin))
	time.Sleep(pollGap)
	deliver("poll after a Bind during the outage", others[1], loggedIn)
	// Never used before the cut, and created during it: the whole
	// browser part through the others.
	var during *session
	for i := 0; during == nil; i++ {
		if i == 100 {
			t.Fatalf("100 sessions and none owned by %s", victim.name)
		}
		if s := c.create(t, others[i%2]); ownerOf(c.reps, s.SessionID) == victim {
			during = s
		}
	}
	for i, s := range []*session{fresh, during} {
		begin := time.Now()
		c.bindVia(t, s, others[i%2], others[(i+1)%2])
		flows.add(time.Since(begin))
		time.Sleep(pollGap)
		deliver("poll after the whole browser part during the outage", others[(i+1)%2], s)
	}
	time.Sleep(time.Until(cutAt.Add(outageWindow)))
	close(stop)
	poller.Wait()
	for _, r := range others {
		if n := r.metric(t, "ring_peer_fallbacks_total"); n < 1 {
			t.Errorf("%s: ring_peer_fallbacks_total %v: it never skipped %s", r.name, n, victim.name)
		} else {
			t.Logf("%s answered %v requests for %s's sessions itself", r.name, n, victim.name)
		}
	}
	t.Logf("during the %s outage of %s (%d rounds of polls of %d pending sessions): polls of its sessions %s; of the others' %s; Bind presses %s; whole browser parts %s",
		time.Since(cutAt).Round(time.Second), victim.name, rounds, len(polled), polls, othersPolls, binds, flows)

	heal()
	healedAt := time.Now()
	t.Logf("%s answers its peers again", victim.name)
	victim.waitReady(t)
	// After it, for afterWindow, a client polls the victim's pending
	// sessions a poll gap apart through every replica: pending each time,
	// also while requests that were on their way to the victim during the
	// outage arrive late. Such a late admit request still counts on the
	// owner, which compares no clock with its sender's (docs/sessions.md,
	// the frozen-replica row): a session's next poll may get one 429 whose
	// Retry-After is within the poll interval, never more.
	after := &latencies{}
	slowedDown := map[string]bool{}
	for i := 0; time.Since(healedAt) < afterWindow || i < len(c.reps); i++ {
		r := c.reps[i%len(c.reps)]
		time.Sleep(pollGap)
		for _, s := range pending {
			a := c.poll(r, s)
			after.add(a.took)
			retry, err := strconv.Atoi(a.retryAfter)
			if a.status == http.StatusTooManyRequests && a.code == v1alpha1.ErrorSlowDown && !slowedDown[s.SessionID] &&
				err == nil && retry >= 1 && time.Duration(retry)*time.Second <= pollInterval && a.took <= answerWithin {
				slowedDown[s.SessionID] = true
				t.Logf("%s after the outage, poll %d of %s on %s: one 429 from a late admit request: %s",
					time.Since(healedAt).Round(time.Millisecond), i+1, s.SessionID, r.name, a)
				continue
			}
			if !a.pending() || a.took > answerWithin {
				t.Errorf("%s after the outage, poll %d of %s (owned by %s, polled %s before) on %s: %s",
					time.Since(healedAt).Round(time.Millisecond), i+1, s.SessionID, victim.name, pollGap, r.name, a)
			}
		}
	}
	// And its sessions bind through it again.
	c.bindVia(t, pending[0], victim, victim)
	time.Sleep(pollGap)
	c.deliver(t, others[0], pending[0], answerWithin)
	t.Logf("after the outage: polls %s", after)
}

// TestAPIServerRestart: the provider cluster's kube-apiserver is stopped
// for about 8 s and started again while sessions are pending. Meanwhile
// every poll is answered within 5 s: pending sessions from the records'
// informer caches, and only what must write to the API server (a first
// delivery, a link's single use) gets 503 with Retry-After. Afterwards
// binds and polls go on, without 503.
func TestAPIServerRestart(t *testing.T) {
	c := newCluster(t, clusterOpts{replicas: 2})
	reps := c.reps

	var boundBefore, loggedIn, pending, fresh []*session
	for i := range 2 {
		s := c.create(t, reps[i%2])
		c.bindVia(t, s, reps[i%2], reps[(i+1)%2])
		boundBefore = append(boundBefore, s)
	}
	var sels []*selection
	for i := range 2 {
		s := c.create(t, reps[i%2])
		c.f.pin(reps[(i+1)%2])
		sels = append(sels, c.openSelection(t, s))
		loggedIn = append(loggedIn, s)
	}
	for i := range 2 {
		pending = append(pending, c.create(t, reps[i%2]))
		fresh = append(fresh, c.create(t, reps[i%2]))
	}
	for _, s := range pending {
		expect(t, "poll before the restart", c.poll(reps[0], s), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	}
	time.Sleep(pollGap)

	// The restart: SIGTERM, 8 s down, the same flags again, ready.
	restarted := make(chan error, 1)
	go func() { restarted <- c.cp.RestartAPIServer(c.ctx, 8*time.Second) }()
	admin := kubernetes.NewForConfigOrDie(c.cp.AdminConfig())
	testutil.Await(t, "kube-apiserver refuses connections", func() bool {
		ctx, cancel := context.WithTimeout(c.ctx, time.Second)
		defer cancel()
		_, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err != nil
	})
	downAt := time.Now()
	t.Logf("kube-apiserver stopped")

	lat := &latencies{}
	counts := map[string]int{}
	var created []*session
	// 503 answers must say when to come back.
	unavailable := func(a pollAnswer) bool {
		return a.status == http.StatusServiceUnavailable && a.code == v1alpha1.ErrorTemporarilyUnavailable && a.retryAfter != ""
	}
	// For 5 s of the 8 it is down at least.
	for round := 0; time.Since(downAt) < 5*time.Second; round++ {
		r := reps[round%2]
		for _, s := range append(append([]*session{}, pending...), loggedIn...) {
			a := c.poll(r, s)
			lat.add(a.took)
			counts[fmt.Sprintf("pending session: %d %s", a.status, a.code)]++
			if !a.pending() || a.took > answerWithin {
				t.Errorf("API server down: poll of a pending session on %s: %s; want 403 authorization_pending within %s (the informer's cache knows it is pending)", r.name, a, answerWithin)
			}
		}
		for _, s := range boundBefore {
			a := c.poll(r, s)
			lat.add(a.took)
			counts[fmt.Sprintf("bound session: %d %s", a.status, a.code)]++
			if !unavailable(a) || a.took > answerWithin {
				t.Errorf("API server down: poll of a bound session on %s: %s; want 503 temporarily_unavailable with Retry-After within %s (its first delivery cannot be recorded)", r.name, a, answerWithin)
			}
		}
		created = append(created, c.create(t, r))
		time.Sleep(pollGap)
	}
	// A link opened while the API server is down writes nothing (its
	// nonce is spent by the sign-in it leads to): it goes on to the
	// identity provider, and binds once the API server is back (below).
	if code := openLink(t, reps[0], fresh[0].authURL()); code != http.StatusSeeOther {
		t.Errorf("API server down: a fresh link: %d, want 303 to the identity provider", code)
	}
	t.Logf("while kube-apiserver was down: answers %v; %s", counts, lat)

	if err := <-restarted; err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver ready again after %s down", time.Since(downAt).Round(time.Millisecond))
	upAt := time.Now()

	// Bound before: delivered at once, on either replica.
	for i, s := range boundBefore {
		a := c.poll(reps[i%2], s)
		if a.status != http.StatusOK {
			t.Fatalf("after the restart: first poll of a session bound before it on %s: %s", reps[i%2].name, a)
		}
		c.checkResponse(t, s, a.body)
	}
	// On the selection page all along: Bind, and the response.
	var readBack []time.Duration
	for i, sel := range sels {
		c.f.pin(reps[i%2])
		c.mustBind(t, sel)
		bound := time.Now()
		time.Sleep(pollGap)
		c.deliver(t, reps[(i+1)%2], sel.s, time.Minute)
		readBack = append(readBack, time.Since(bound).Round(time.Millisecond))
	}
	// Never used, or created while it was down: the whole browser part.
	for i, s := range append(fresh, created[0], created[len(created)-1]) {
		c.bindVia(t, s, reps[i%2], reps[(i+1)%2])
		time.Sleep(pollGap)
		c.deliver(t, reps[i%2], s, time.Minute)
	}
	for i, s := range pending {
		a := c.poll(reps[i%2], s)
		if !a.pending() {
			t.Errorf("after the restart: poll of a pending session: %s", a)
		}
		if bytes.Contains(a.body, []byte("kubeconfig")) {
			t.Errorf("a pending session got a response")
		}
	}
	t.Logf("after kube-apiserver came back: the first binds were read back by the other replica within %v; all done %s after it was ready",
		readBack, time.Since(upAt).Round(time.Millisecond))
}

// TestReplicaWithLaggingRecords: replica-1 reaches the API server through
// a proxy that can hold back the events of its watches while passing
// every other request: its informer of the session records lags, as
// after an API server restart while its reflector backs off (up to 30 s;
// TestAPIServerRestart logs how long a bind took to be read back). Two
// sessions, one owned by each replica, are bound through replica-0.
// Polled on replica-0, which has the records, both get their response;
// polled on replica-1, which has not, both are pending or get their
// response, never 503. (Before the ring read a pending outcome locally, a
// completed outcome from the owner met replica-1's own view in Deliver:
// 503 "session store failed: session is not pending".) Once the events
// flow again, every poll gets the response.
func TestReplicaWithLaggingRecords(t *testing.T) {
	c := newCluster(t, clusterOpts{replicas: 2, noStart: true})
	fresh, lagging := c.reps[0], c.reps[1]
	events := &gate{}
	lagging.args = replaceFlag(t, lagging.args, "--kubeconfig", lagProxy(t, c.cp, events))
	for _, r := range c.reps {
		r.start(t)
	}
	for _, r := range c.reps {
		r.waitReady(t)
	}

	owned := map[*replica]*session{}
	for i := 0; len(owned) < 2; i++ {
		if i == 64 {
			t.Fatal("64 sessions and still not one owned by each replica")
		}
		s := c.create(t, c.reps[i%2])
		if o := ownerOf(c.reps, s.SessionID); owned[o] == nil {
			owned[o] = s
		}
	}
	for _, s := range owned {
		expect(t, "poll before the watch lags", c.poll(lagging, s), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	}

	events.close()
	t.Logf("%s's watch events held back from now on", lagging.name)
	for _, o := range []*replica{fresh, lagging} {
		c.bindVia(t, owned[o], fresh, fresh)
	}
	time.Sleep(pollGap)
	for _, o := range []*replica{fresh, lagging} {
		s := owned[o]
		a := c.poll(lagging, s)
		t.Logf("a session owned by %s, polled on %s (lagging): %s", o.name, lagging.name, a)
		switch {
		case a.status == http.StatusOK:
			c.checkResponse(t, s, a.body)
		case a.pending():
		default:
			t.Errorf("a bound session owned by %s, polled on %s whose records lag: %s; want the response or pending\nbody: %s", o.name, lagging.name, a, a.body)
		}
	}
	time.Sleep(pollGap)
	for _, o := range []*replica{fresh, lagging} {
		b := c.poll(fresh, owned[o])
		t.Logf("a session owned by %s, polled on %s: %s", o.name, fresh.name, b)
		if b.status != http.StatusOK {
			t.Errorf("a bound session owned by %s, polled on %s, which has its record: %s; want the response", o.name, fresh.name, b)
		}
	}

	events.open()
	t.Logf("%s's watch events flow again", lagging.name)
	for _, r := range c.reps {
		time.Sleep(pollGap)
		for _, s := range owned {
			c.deliver(t, r, s, answerWithin)
		}
	}
}

// gate holds back data while closed.
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // nil while open
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.closed
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// gatedBody passes what it read only while the gate is open.
type gatedBody struct {
	io.ReadCloser
	g *gate
}

func (b gatedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.g.wait()
	return n, err
}

// lagProxy serves the API server of cp as the cluster admin, with TLS, on
// loopback, holding back the events of watches while events is closed; it
// returns a kubeconfig for it.
func lagProxy(t *testing.T, cp *controlplane.ControlPlane, events *gate) string {
	t.Helper()
	upstream, err := rest.TransportFor(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(cp.Host())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(&httputil.ReverseProxy{
		Transport:     upstream,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
		},
		ModifyResponse: func(resp *http.Response) error {
			if w := resp.Request.URL.Query().Get("watch"); w == "true" || w == "1" {
				resp.Body = gatedBody{resp.Body, events}
			}
			return nil
		},
	})
	t.Cleanup(srv.Close)
	t.Cleanup(events.open) // before the server closes: nothing stays held
	return controlplane.KubeconfigFile(t, &rest.Config{
		Host:            srv.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})},
	})
}
