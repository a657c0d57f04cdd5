package hashring

import (
	"context"
	"errors"
	"io"
	"net/url"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Membership. Candidates are the replicas this one may talk to: SetPeers
// (--peers, or the ready endpoints discovery sees). Members are the
// replicas that joined (told this one so, with their incarnation) and
// neither left nor were found dead; this replica is a member of its own
// ring between Join and Leave. The ring is the consistent hash over the
// members; the last few rings are kept, newest first, so that a new owner
// knows whom to ask for a session it does not hold yet (owner.go).
//
// Death: a call to a member that is refused (nothing listens, no route)
// marks it down: it leaves the ring until it joins again or sends any
// request as a member. A call that times out or fails otherwise does not:
// the member is "slow or restarting", and its sessions answer
// sessions.ErrUnavailable (503) rather than move.

// historyLen is how many rings are kept. Each ring change moves a share of
// the sessions; a session whose owner changed more often than this before
// it was touched or pushed (resync) is found only through its copies.
const historyLen = 8

// ringView is one ring: its members, the owner of each ID, and the ring
// without each member (whose owner of an ID is that ID's backup).
type ringView struct {
	nodes   []string
	hash    *ring
	without map[string]*ring
}

func newRingView(nodes []string) *ringView {
	v := &ringView{nodes: nodes, hash: newRing(nodes, virtualNodes), without: make(map[string]*ring, len(nodes))}
	for i, n := range nodes {
		rest := append(slices.Clone(nodes[:i]), nodes[i+1:]...)
		v.without[n] = newRing(rest, virtualNodes)
	}
	return v
}

// owner is the first member on the ring for id ("" for an empty ring).
func (v *ringView) owner(id string) string {
	if len(v.nodes) == 0 {
		return ""
	}
	return v.hash.get(id)
}

// backup is the member that would own id if its owner were gone ("" with
// fewer than two members).
func (v *ringView) backup(id string) string {
	if len(v.nodes) < 2 {
		return ""
	}
	return v.without[v.owner(id)].get(id)
}

type membership struct {
	candidates []string
	members    map[string]uint64 // peer URL → incarnation
	down       map[string]uint64 // marked down → incarnation then
	// left holds the incarnations that said they are not members any more
	// (leaving): a message of theirs sent earlier and arriving late must
	// not add them back. A process never joins again after it left; a new
	// process at the same URL has a new incarnation.
	left    map[string]uint64
	joined  bool
	leaving bool
	rings   []*ringView // newest first; never empty
}

// rebuildLocked recomputes the ring from the members and, if it changed,
// records it and wakes the resync loop.
func (s *Store) rebuildLocked() {
	m := &s.m
	nodes := make([]string, 0, len(m.members)+1)
	for p := range m.members {
		nodes = append(nodes, p)
	}
	if m.joined && !m.leaving {
		nodes = append(nodes, s.self)
	}
	if len(nodes) == 0 && !m.leaving && len(m.candidates) == 0 {
		// Alone, with nobody to join: own everything. A replica with
		// candidates owns nothing until it joined: until then its ring
		// is the members it heard of, or empty (ErrUnavailable).
		nodes = append(nodes, s.self)
	}
	slices.Sort(nodes)
	if len(m.rings) > 0 && slices.Equal(nodes, m.rings[0].nodes) {
		return
	}
	m.rings = append([]*ringView{newRingView(nodes)}, m.rings...)
	if len(m.rings) > historyLen {
		m.rings = m.rings[:historyLen]
	}
	s.log.Info("session hashring members", "members", nodes)
	select {
	case s.ringChanged <- struct{}{}:
	default:
	}
}

func (s *Store) view() *ringView {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m.rings[0]
}

// isMember says whether this replica is in its own ring as a member.
func (s *Store) isMember() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m.joined && !s.m.leaving
}

// Ready says whether the replica is a member of the ring: false (an
// error in words) before Join finished and from Leave on. /readyz reports
// it, so a load balancer sends requests only to members.
func (s *Store) Ready() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.m.leaving:
		return errors.New("leaving the session ring")
	case !s.m.joined:
		return errors.New("not joined to the session ring yet")
	}
	return nil
}

// noteSender updates the membership from what a peer says of itself in a
// request or an answer: a member is (re)added, one that left is taken out
// for good (that incarnation). A message of a replica that has not joined
// yet changes nothing: it may be a late one, sent before it joined.
func (s *Store) noteSender(from string, inc uint64, member, left bool) {
	if from == "" || from == s.self || inc == 0 {
		return // says nothing of who it is
	}
	// Nearly always a member this replica knows, as it knows it: nothing
	// to change, under the read lock (every peer request and answer).
	s.mu.RLock()
	cur, known := s.m.members[from]
	s.mu.RUnlock()
	if !left && known && cur == inc {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, known = s.m.members[from]
	switch {
	case left:
		if s.m.left[from] == inc && !known {
			return
		}
		s.m.left[from] = inc
		if !known || cur != inc {
			return
		}
		delete(s.m.members, from)
	case member && s.m.left[from] == inc:
		return // sent before it left, arriving late
	case member && (!known || cur != inc):
		s.m.members[from] = inc
		delete(s.m.down, from)
	case known && cur != inc:
		// Another process at the member's URL, not joined yet: the one
		// that was the member is gone (its backups serve its sessions).
		delete(s.m.members, from)
		s.m.down[from] = cur
	default:
		return
	}
	s.rebuildLocked()
}

// status says what this replica tells peers of itself.
func (s *Store) status() (member, left bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m.joined && !s.m.leaving, s.m.leaving
}

// sender is what this replica says of itself in each message and answer.
func (s *Store) sender() Sender {
	member, left := s.status()
	return Sender{From: s.self, Inc: s.inc, Member: member, Left: left}
}

// markDown takes a member that refused a connection out of the ring.
func (s *Store) markDown(peer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inc, known := s.m.members[peer]
	if !known {
		return
	}
	s.log.Warn("session ring member is down", "peer", peer)
	delete(s.m.members, peer)
	s.m.down[peer] = inc
	s.rebuildLocked()
}

// refused says whether err means nothing listens at the peer (refused,
// no route): the process is gone. Timeouts and 5xx do not: a slow or
// restarting replica may still hold sessions.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH)
}

// peerDown says whether a failed call means peer is gone. A connection
// that broke without an answer (EOF, reset: a reused keep-alive
// connection to a process that died) says nothing by itself, so it is
// probed with a fresh connection: refused means gone.
func (s *Store) peerDown(peer string, err error) bool {
	if err == nil {
		return false // before errors.As, whose target escapes: every answered call
	}
	var ou *OwnerUnavailableError
	if !errors.As(err, &ou) {
		return false
	}
	if refused(ou.Err) {
		return true
	}
	if !errors.Is(ou.Err, io.EOF) && !errors.Is(ou.Err, io.ErrUnexpectedEOF) && !errors.Is(ou.Err, syscall.ECONNRESET) &&
		!errors.Is(ou.Err, syscall.EPIPE) {
		return false
	}
	return s.connectionDies(peer)
}

// send is call for a request of this replica's own (a forwarded one
// loses the identity of the replica it came from: the batch says who
// sends, Sender); it learns the answering replica's membership from the
// answer.
func (s *Store) send(ctx context.Context, peer string, req *peerRequest) (*peerResponse, error) {
	// Who sends goes in the batch (Sender), and a join's Member in the
	// request.
	req.From, req.Inc, req.Left = "", 0, false
	if req.Op != opJoin {
		req.Member = false
	}
	resp, err := s.call(ctx, peer, req)
	if err == nil && req.Op != opJoin {
		s.noteSender(peer, resp.Inc, resp.Member, resp.Left)
	}
	return resp, err
}

// SetPeers sets the candidates: the base URLs of the replicas (this one's
// own is ignored). Members no longer listed are taken out of the ring
// (discovery dropped them: not ready, or gone). A replica listed for the
// first time is added when it joins, not before: this one then announces
// itself to it if it is a member already.
func (s *Store) SetPeers(peers []string) {
	ps := slices.Clone(peers)
	slices.Sort(ps)
	ps = slices.Compact(ps)
	ps = slices.DeleteFunc(ps, func(p string) bool { return p == s.self })
	s.mu.Lock()
	old := s.m.candidates
	s.m.candidates = ps
	var fresh []string
	changed := len(old) == 0 || len(ps) == 0 // the alone rule may change
	for _, p := range old {
		if !slices.Contains(ps, p) {
			if _, ok := s.m.members[p]; ok {
				delete(s.m.members, p)
				changed = true
			}
		}
	}
	for _, p := range ps {
		if _, ok := s.m.members[p]; !ok && !slices.Contains(old, p) {
			fresh = append(fresh, p)
		}
	}
	if changed {
		s.rebuildLocked()
	}
	announce := s.m.joined && !s.m.leaving && len(fresh) > 0
	s.mu.Unlock()
	if !slices.Equal(old, ps) {
		s.log.Info("session hashring candidates", "peers", ps)
	}
	if announce {
		s.bg.Go(func() { s.announce(s.bgCtx, fresh, true) })
	}
}

// Peers returns the candidates and this replica.
func (s *Store) Peers() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append(slices.Clone(s.m.candidates), s.self)
}

// Members returns the members of the current ring.
func (s *Store) Members() []string { return slices.Clone(s.view().nodes) }

// announce sends join to peers (member: as a member, else a hello) and
// adds those that answer as members.
func (s *Store) announce(ctx context.Context, peers []string, member bool) {
	type answer struct {
		peer string
		inc  uint64
	}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got []answer
	)
	for _, p := range peers {
		wg.Go(func() {
			resp, err := s.send(ctx, p, &peerRequest{Op: opJoin, Member: member})
			if err != nil {
				s.log.Info("session ring peer did not answer the join", "peer", p, "error", err)
				return
			}
			if resp.Member {
				mu.Lock()
				got = append(got, answer{p, resp.Inc})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(got) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range got {
		if s.m.left[a.peer] == a.inc {
			continue
		}
		s.m.members[a.peer] = a.inc
		delete(s.m.down, a.peer)
	}
	s.rebuildLocked()
}

// Join makes this replica a member of the ring: it asks every candidate
// who the members are (so its ring history holds the ring before it
// joined, where its new sessions' previous owners are), enters its own
// ring, and announces itself to every candidate, which adds it at once.
// Candidates that do not answer are skipped; they add this replica when
// they join themselves. Serve the peer API before calling Join.
func (s *Store) Join(ctx context.Context) error {
	s.mu.RLock()
	cands := slices.Clone(s.m.candidates)
	s.mu.RUnlock()
	s.announce(ctx, cands, false)
	s.mu.Lock()
	if s.m.leaving {
		s.mu.Unlock()
		return errors.New("hashring: Join after Leave")
	}
	s.m.joined = true
	s.rebuildLocked()
	s.mu.Unlock()
	s.announce(ctx, cands, true)
	return ctx.Err()
}

// Leave takes this replica out of the ring and hands its sessions over:
// (1) it stops being an owner in its own ring (operations in flight finish
// on their own: each is atomic in the local store, and a session handed
// over is refused locally from then on, so later ones are forwarded to the
// new owner); (2) it tells every member, which takes it out of its ring;
// (3) it pushes every session it owns, with its nonces, to the session's
// new owner. Keep the peer API serving until Leave returned and the
// public server stopped: requests for a session in transit are forwarded
// or answered by the new owner's transfer from here.
func (s *Store) Leave(ctx context.Context) error {
	s.mu.Lock()
	s.m.leaving = true
	s.rebuildLocked()
	members := make([]string, 0, len(s.m.members))
	for p := range s.m.members {
		members = append(members, p)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range members {
		wg.Go(func() {
			if _, err := s.send(ctx, p, &peerRequest{Op: opLeave}); err != nil {
				s.log.Warn("session ring member did not hear the leave", "peer", p, "error", err)
			}
		})
	}
	wg.Wait()
	// The members, not this replica, are the owners now: push what is
	// owned here, retrying while some push fails and time is left.
	for attempt := 0; ; attempt++ {
		left := s.resync(ctx)
		if left == 0 {
			return nil
		}
		if attempt == 4 || ctx.Err() != nil {
			return errors.New("hashring: some sessions could not be handed over")
		}
		s.sleep(ctx, resyncRetry)
	}
}

// heartbeatEvery is how often a replica checks its members and
// candidates (heartbeat).
const heartbeatEvery = 2 * time.Second

// heartbeat finds members that died before any request did (a fresh TCP
// connection refused: down, so their sessions' backups take them and get
// a backup again) and heals missed joins (a candidate that is not a
// member is greeted; it answers whether it is one, and adds this replica
// if it is one). It costs a connect per member and a hello per missing
// candidate every heartbeatEvery; nothing when all is well.
func (s *Store) heartbeat() {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-t.C:
		}
		s.mu.RLock()
		var members, missing []string
		for p := range s.m.members {
			members = append(members, p)
		}
		for _, p := range s.m.candidates {
			if _, ok := s.m.members[p]; !ok {
				missing = append(missing, p)
			}
		}
		joined := s.m.joined && !s.m.leaving
		s.mu.RUnlock()
		for _, p := range members {
			if s.refusesConnections(p) {
				s.markDown(p)
			}
		}
		if joined && len(missing) > 0 {
			s.announce(s.bgCtx, missing, true)
		}
	}
}

// refusesConnections says whether a fresh connection to peer is refused.
func (s *Store) refusesConnections(peer string) bool { return s.probe(peer, 0) }

// probeWait is how long connectionDies waits for a fresh connection to be
// reset: a live peer sends nothing before it gets a request, so the wait
// ends with the deadline; one that is dying resets it at once.
const probeWait = 100 * time.Millisecond

// connectionDies probes peer after a connection to it broke: refused
// means gone, and so does a fresh connection that is reset or closed at
// once. A process being killed resets its established connections before
// its listener is closed, so a probe in that instant still connects (the
// kernel accepts it into the backlog) and is reset a moment later;
// checking only that it connects answered 503 to every request that
// failed in that instant (seen in test/replicas' crash phase).
func (s *Store) connectionDies(peer string) bool { return s.probe(peer, probeWait) }

// probe dials peer: gone if refused, or if a connection is reset or
// closed within wait (0: not waited for).
func (s *Store) probe(peer string, wait time.Duration) bool {
	u, err := url.Parse(peer)
	if err != nil {
		return false
	}
	c, err := s.dialer.DialContext(s.bgCtx, "tcp", u.Host)
	if err != nil {
		return refused(err)
	}
	defer c.Close()
	if wait <= 0 {
		return false
	}
	c.SetReadDeadline(time.Now().Add(wait))
	_, err = c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// OwnerOf returns the owner of session id in a ring of these members, as
// every member of that ring computes it (for tests and tools that predict
// where a session lives).
func OwnerOf(members []string, id string) string {
	ms := slices.Clone(members)
	slices.Sort(ms)
	return newRingView(slices.Compact(ms)).owner(id)
}
