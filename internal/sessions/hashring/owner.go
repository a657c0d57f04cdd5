package hashring

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// Ownership. A replica serves an operation of session S as owner only if
// its local store holds S as owned (the "token"); the token moves by
// Demote at the old holder and Import at the new one, atomically with
// respect to the operations on each side, so no operation is served on a
// stale copy. The ring says where the token should be: a replica whose
// ring names it owner of S but that does not hold S takes it (take) from
// the previous owners and backups its ring history names; every other
// replica forwards to the ring's owner.
//
// Every mutation an owner serves is sent to the replication target (the
// ring's backup of S, or the ring's owner while the token has not moved
// there yet) before the owner answers, so the backup can go on when the
// owner dies.

// maxHops bounds forwarding: a request is forwarded at most this many
// times (rings that briefly disagree while replicas join or leave: each
// hop goes to a replica that heard of a newer change), then answered
// ErrUnavailable.
const maxHops = 3

// resyncRetry is the pause before pushing again what a resync could not.
const resyncRetry = time.Second

// resyncBatch is how many records go in one handover or replicate call at
// most; a batch is also cut before it could exceed half the largest peer
// message (wireSize), as responses may be large.
const resyncBatch = 64

// wireSize estimates a record's size in a peer message: the response in
// base64, each nonce hash in decimal, and the rest of the session.
func wireSize(rec memory.Record) int {
	s := rec.Session
	return len(s.Response)*4/3 + len(rec.Nonces)*21 + len(s.ID) + len(s.ClusterID) + len(s.Secret) +
		len(s.CallbackURL) + len(s.CallbackSessionID) + len(s.DenyReason) + 256
}

// route runs a session operation where the session's token is: here if
// held, else at the owner the ring names (taking it first when that is
// this replica). A member found down on the way is taken out of the ring
// and the operation goes to the next owner: its backup, which holds a
// copy.
func (s *Store) route(ctx context.Context, req *peerRequest) (*peerResponse, error) {
	for attempt := 0; attempt < 4; attempt++ {
		if s.mayServeHere(req) {
			if resp, err, served := s.serveLocal(ctx, req); served {
				return resp, err
			}
		}
		owner := s.view().owner(req.ID)
		if owner == "" {
			return nil, fmt.Errorf("%w: this replica has not joined the session ring", sessions.ErrUnavailable)
		}
		if owner == s.self {
			if req.Op == opCreate {
				return s.createLocal(ctx, req)
			}
			if err := s.take(ctx, req.ID); err != nil {
				return nil, err
			}
			continue
		}
		if req.Hop >= maxHops {
			return nil, fmt.Errorf("%w: the replicas disagree on the owner of the session", sessions.ErrUnavailable)
		}
		fwd := *req
		fwd.Hop++
		resp, err := s.send(ctx, owner, &fwd)
		if s.peerDown(owner, err) {
			s.markDown(owner)
			continue
		}
		if err == nil && resp.Copy != nil {
			err = s.importCopy(ctx, owner, req.ID, resp)
		}
		return resp, err
	}
	return nil, fmt.Errorf("%w: the session's owner kept changing", sessions.ErrUnavailable)
}

func (s *Store) createLocal(ctx context.Context, req *peerRequest) (*peerResponse, error) {
	sess := fromWire(req.Session)
	if err := s.local.Create(ctx, sess); err != nil {
		return nil, err
	}
	return &peerResponse{}, s.replicate(ctx, memory.Record{Session: sess})
}

// mayServeHere says whether serveLocal can serve req: the static part is
// served from a copy too, everything else only by the owner. It spares a
// request that will be forwarded the local store's work (a poll hashes
// its nonce before it finds the session is not owned here).
func (s *Store) mayServeHere(req *peerRequest) bool {
	if req.Op == opStatic {
		return true
	}
	owned, _ := s.local.Holds(req.ID)
	return owned
}

// serveLocal runs req on the local store if it holds the session as
// owner; served is false if it does not.
func (s *Store) serveLocal(ctx context.Context, req *peerRequest) (resp *peerResponse, err error, served bool) {
	resp = &peerResponse{}
	var sess sessions.Session
	switch req.Op {
	case opCreate:
		return nil, nil, false
	case opGet:
		if sess, err = s.local.Get(ctx, req.ID); err == nil {
			resp.Session = toWire(sess)
		}
	case opState:
		if sess, err = s.local.Get(ctx, req.ID); err == nil {
			w := mutableOnly(toWire(sess))
			d := memory.StaticDigest(sess)
			w.StaticDigest = d[:]
			resp.Session = w
		}
	case opStatic:
		// Held as owner or as a copy: the static part is the same (it
		// never changes), so a backup answers too, and a replica whose
		// ring names it owner need not take the session for this.
		if sess, ok := s.local.Peek(req.ID); ok {
			resp.Static = mustJSON(staticOf(sess))
		} else {
			err = sessions.ErrNotFound
		}
	case opUseNonce:
		if err = s.local.UseNonce(ctx, req.ID, req.Nonce); err == nil {
			err = s.replicateChange(ctx, req, resp, req.Nonce)
		}
	case opPoll:
		if sess, err = s.recordPollHere(ctx, req); err == nil {
			resp.Session = toWire(sess)
			if len(req.StaticDigest) > 0 {
				resp.Session = mutableOnly(resp.Session)
			}
			err = s.replicateFor(ctx, req, resp, pollCopy(sess, req))
		}
	case opComplete:
		if err = s.local.Complete(ctx, req.ID, req.Response); err == nil {
			err = s.replicateChange(ctx, req, resp, "")
		}
	case opDeny:
		if err = s.local.Deny(ctx, req.ID, req.Reason); err == nil {
			err = s.replicateChange(ctx, req, resp, "")
		}
	case opDelete:
		if owned, _ := s.local.Holds(req.ID); !owned {
			return nil, nil, false
		}
		if err = s.local.Delete(ctx, req.ID); err == nil {
			s.dropCopy(ctx, req.ID)
		}
	default:
		return nil, errBadOp, true
	}
	if errors.Is(err, sessions.ErrNotFound) || errors.Is(err, memory.ErrNotOwned) {
		return nil, nil, false
	}
	return resp, err, true
}

// recordPollHere records req's poll on the local store, which answers
// ErrNotOwned or ErrNotFound if it does not hold the session as owner. A
// non-owner that checked the signature with a cached static part sends
// its digest: a poll checked with another session's secret (an ID used
// again) changes nothing here.
func (s *Store) recordPollHere(ctx context.Context, req *peerRequest) (sessions.Session, error) {
	if len(req.StaticDigest) > 0 {
		return s.local.RecordPollChecked(ctx, req.ID, req.Nonce, time.Duration(req.Interval), req.Req, req.StaticDigest)
	}
	return s.local.RecordPollRequest(ctx, req.ID, req.Nonce, time.Duration(req.Interval), req.Req)
}

// pollCopy is what the backup gets of a recorded poll: the mutable part,
// the nonce and the poll's mark.
func pollCopy(sess sessions.Session, req *peerRequest) memory.Record {
	h := memory.NonceHash(req.Nonce)
	return memory.Record{Session: sess, Nonces: []uint64{h}, Partial: true, Mutable: true,
		LastPoll: memory.PollMark{Nonce: h, Request: req.Req}}
}

// replicateChange sends the session as it is now, with the nonce it used
// (if any), to the replication target (replicateFor).
func (s *Store) replicateChange(ctx context.Context, req *peerRequest, resp *peerResponse, nonce string) error {
	sess, ok := s.local.Peek(req.ID)
	if !ok {
		return nil // expired meanwhile
	}
	rec := memory.Record{Session: sess, Partial: true}
	if nonce != "" {
		rec.Nonces = []uint64{memory.NonceHash(nonce)}
	}
	return s.replicateFor(ctx, req, resp, rec)
}

// replicateFor copies rec, the change req made, to the replication
// target before the owner answers req. When the target is the replica
// that sent req (with two replicas, every forwarded request), the copy
// goes back in the answer instead (resp.Copy): that replica imports it
// before it answers its own caller (route), so the copy is in place
// before anyone sees the answer, as with replicate, for one round trip
// instead of two.
func (s *Store) replicateFor(ctx context.Context, req *peerRequest, resp *peerResponse, rec memory.Record) error {
	if req.From != "" && req.From != s.self && s.target(req.ID) == req.From {
		w := toWireRecord(rec)
		if rec.Mutable && resp.Session != nil {
			w.Session = nil // the same as the answer's: sent once
		}
		resp.Copy = &w
		return nil
	}
	return s.replicate(ctx, rec)
}

// importCopy imports the copy that the owner peer sent back in resp
// (replicateFor) and takes it off resp, so that it is not passed on. Its
// errors are replicate's: ErrNonceUsed if this replica acts as owner of
// the session too and saw the nonce; any other failure is counted and
// costs availability nothing. A partial copy of a session not held here
// yet is completed with the owner's whole record. A copy of another
// session than the request's is not taken.
func (s *Store) importCopy(ctx context.Context, owner, id string, resp *peerResponse) error {
	w := *resp.Copy
	resp.Copy = nil
	if w.Session == nil && w.Mutable {
		w.Session = resp.Session
	}
	rec, ok := fromWireRecord(w)
	if !ok || rec.Session.ID != id {
		s.replicationFailed(owner, errBadOp)
		return nil
	}
	err := s.local.Import(rec, false)
	if errors.Is(err, sessions.ErrNotFound) {
		err = s.fetchCopy(ctx, owner, rec.Session.ID)
	}
	switch {
	case err == nil:
	case errors.Is(err, sessions.ErrNonceUsed):
		return err
	default:
		s.replicationFailed(owner, err)
	}
	return nil
}

// fetchCopy asks owner for its whole record of id and keeps it as a copy.
func (s *Store) fetchCopy(ctx context.Context, owner, id string) error {
	resp, err := s.send(context.WithoutCancel(ctx), owner, &peerRequest{Op: opExport, ID: id})
	if err != nil {
		return err
	}
	if resp.Record == nil {
		return nil // gone meanwhile
	}
	rec, ok := fromWireRecord(*resp.Record)
	if !ok {
		return errBadOp
	}
	return s.local.Import(rec, false)
}

// serveExport answers fetchCopy: the record held here, owned or a copy,
// unchanged.
func (s *Store) serveExport(id string) *peerResponse {
	rec, _, ok := s.local.Export(id)
	if !ok {
		return &peerResponse{}
	}
	w := toWireRecord(rec)
	return &peerResponse{Record: &w}
}

// target is where the copy of a session owned here goes: the ring's
// owner if that is another replica (the token will move there), else the
// ring's backup.
func (s *Store) target(id string) string {
	v := s.view()
	if o := v.owner(id); o != s.self && o != "" {
		return o
	}
	if b := v.backup(id); b != s.self {
		return b
	}
	return ""
}

// replicate sends rec to the replication target before the owner answers.
// The only error it returns is ErrNonceUsed: the target acts as owner of
// the session too (a join's overlap) and saw the nonce. A target that
// cannot be reached costs availability nothing: the owner answers, and
// the failure is counted (hashring_replication_failures_total); the
// change is then only here until a resync or the next change carries it.
func (s *Store) replicate(ctx context.Context, rec memory.Record) error {
	ctx = context.WithoutCancel(ctx) // done here; the copy must follow
	id := rec.Session.ID
	for attempt := 0; attempt < 3; attempt++ {
		t := s.target(id)
		if t == "" {
			return nil
		}
		resp, err := s.send(ctx, t, &peerRequest{Op: opReplicate, Records: []wireRecord{toWireRecord(rec)}})
		if s.peerDown(t, err) {
			s.markDown(t)
			continue
		}
		if err != nil || len(resp.Errs) != 1 {
			s.replicationFailed(t, err)
			return nil
		}
		switch code := resp.Errs[0]; code {
		case "":
			return nil
		case "nonce_used":
			return sessions.ErrNonceUsed
		case "not_found": // the target holds no copy: send the whole record
			full, _, ok := s.local.Export(id)
			if !ok {
				return nil
			}
			rec = full
		default:
			s.replicationFailed(t, errors.New(code))
			return nil
		}
	}
	return nil
}

func (s *Store) replicationFailed(peer string, err error) {
	s.replFailures.Add(1)
	s.log.Warn("session copy not sent to its backup", "peer", peer, "error", err)
}

// ReplicationFailures counts the mutations whose copy did not reach the
// backup (hashring_replication_failures_total).
func (s *Store) ReplicationFailures() uint64 { return s.replFailures.Load() }

// PeerMessages returns how many messages this replica sent to peers and
// how many requests they carried (hashring_peer_messages_sent_total,
// hashring_peer_requests_sent_total): their ratio is the mean batch size.
func (s *Store) PeerMessages() (messages, requests uint64) {
	return s.pipes.messages.Load(), s.pipes.requests.Load()
}

func (s *Store) dropCopy(ctx context.Context, id string) {
	if t := s.target(id); t != "" {
		if _, err := s.send(context.WithoutCancel(ctx), t, &peerRequest{Op: opDropCopy, ID: id}); err != nil {
			s.log.Info("deleted session's copy not dropped on its backup; it expires there", "peer", t, "error", err)
		}
	}
}

// holder is a replica that may hold a session, from the ring history.
type holder struct {
	peer     string
	wasOwner bool
}

// holders returns the previous owners and backups of id that are not down
// and not this replica, newest ring first, and the current backup last.
func (s *Store) holders(id string) []holder {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var hs []holder
	seen := map[string]bool{s.self: true}
	add := func(p string, owner bool) {
		if p == "" || seen[p] {
			return
		}
		seen[p] = true
		if _, down := s.m.down[p]; down {
			return
		}
		hs = append(hs, holder{p, owner})
	}
	for _, v := range s.m.rings[1:] {
		add(v.owner(id), true)
	}
	for _, v := range s.m.rings[1:] {
		add(v.backup(id), false)
	}
	add(s.m.rings[0].backup(id), false)
	// Then every other member: while rings differ between replicas (a
	// join or leave spreading), the token may be with a replica that no
	// ring of this one names for id. Promoting a copy while it is there
	// would make two owners, so it is asked before any copy is promoted.
	rest := make([]string, 0, len(s.m.members))
	for p := range s.m.members {
		rest = append(rest, p)
	}
	slices.Sort(rest)
	for _, p := range rest {
		add(p, false)
	}
	return hs
}

// take makes this replica, the ring's owner of id, hold it as owner: it
// asks the previous owners and backups for what they hold (a previous
// owner gives up the token), merges everything with its own copy, and
// sends the result to the backup. ErrNotFound if nobody holds the
// session; ErrUnavailable if nobody reachable does but a previous owner,
// or some holder when nothing was found, did not answer (slow, not dead).
func (s *Store) take(ctx context.Context, id string) error {
	_, err := s.takes.Do(id, func() (any, error) { return nil, s.takeOnce(ctx, id) })
	return err
}

func (s *Store) takeOnce(ctx context.Context, id string) error {
	if owned, _ := s.local.Holds(id); owned {
		return nil
	}
	var (
		recs               []memory.Record
		token              bool
		slowOwner, slowAny bool
	)
	for _, h := range s.holders(id) {
		resp, err := s.send(ctx, h.peer, &peerRequest{Op: opTransfer, ID: id})
		if s.peerDown(h.peer, err) {
			s.markDown(h.peer)
			continue
		}
		if err != nil {
			slowAny = true
			slowOwner = slowOwner || h.wasOwner
			continue
		}
		if resp.Record != nil {
			if rec, ok := fromWireRecord(*resp.Record); ok {
				recs = append(recs, rec)
				if resp.Owned {
					token = true
					break
				}
			}
		}
	}
	_, held := s.local.Holds(id)
	switch {
	case !token && slowOwner:
		return fmt.Errorf("%w: a previous owner of the session did not answer", sessions.ErrUnavailable)
	case !token && !held && len(recs) == 0 && slowAny:
		return fmt.Errorf("%w: a replica that may hold the session did not answer", sessions.ErrUnavailable)
	case !held && len(recs) == 0:
		return sessions.ErrNotFound
	}
	for _, rec := range recs {
		if err := s.local.Import(rec, true); err != nil && !errors.Is(err, memory.ErrStaticMismatch) {
			return fmt.Errorf("%w: %v", sessions.ErrUnavailable, err)
		}
	}
	if !s.local.Promote(id) {
		return sessions.ErrNotFound // expired meanwhile
	}
	if !token {
		s.log.Info("session taken over from its copies", "promoted", held, "copies", len(recs))
	}
	if full, _, ok := s.local.Export(id); ok {
		_ = s.replicate(ctx, full)
	}
	return nil
}

// serveTransfer answers a new owner's transfer: the record held here, and
// the token with it if held (this replica keeps a copy).
func (s *Store) serveTransfer(id string) *peerResponse {
	rec, wasOwned, ok := s.local.Demote(id)
	if !ok {
		return &peerResponse{}
	}
	w := toWireRecord(rec)
	return &peerResponse{Record: &w, Owned: wasOwned}
}

// serveRecords imports records pushed by a peer: as copies (replicate) or
// as owner (handover).
func (s *Store) serveRecords(req *peerRequest, owned bool) *peerResponse {
	resp := &peerResponse{Errs: make([]string, len(req.Records))}
	for i, w := range req.Records {
		rec, ok := fromWireRecord(w)
		if !ok {
			resp.Errs[i] = errorCode(errBadOp)
			continue
		}
		if err := s.local.Import(rec, owned); err != nil {
			resp.Errs[i] = errorCode(err)
		}
	}
	return resp
}

// resyncLoop pushes sessions after each ring change, until Close.
func (s *Store) resyncLoop() {
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-s.ringChanged:
		}
		for attempt := 0; attempt < 5 && s.resync(s.bgCtx) > 0; attempt++ {
			s.sleep(s.bgCtx, resyncRetry)
		}
	}
}

func (s *Store) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// resync makes the current ring true for the sessions owned here: those
// whose owner is now another replica are handed over to it (their token
// moves), and the others' full records go to their current backup. It
// returns how many sessions could not be handed over (they stay owned
// here). One batch at a time, so a ring change costs the peers little.
func (s *Store) resync(ctx context.Context) (left int) {
	s.resyncMu.Lock()
	defer s.resyncMu.Unlock()
	v := s.view()
	if len(v.nodes) == 0 {
		return 0 // nobody to hand over to: the sessions end with this replica
	}
	// Copies go only where the backup changed since the last resync; the
	// rest have theirs from every change (replicate).
	prev := s.synced
	handover := map[string][]string{}
	copies := map[string][]string{}
	for _, id := range s.local.Owned() {
		if o := v.owner(id); o != s.self {
			handover[o] = append(handover[o], id)
		} else if b := v.backup(id); b != "" && b != s.self && (prev == nil || prev.backup(id) != b || prev.owner(id) != s.self) {
			copies[b] = append(copies[b], id)
		}
	}
	s.synced = v
	// Copies this replica now owns by the ring (their owner died or left
	// without handing over): take them now, not at their next request, so
	// that they get a backup again.
	for _, id := range s.local.Copies() {
		if ctx.Err() != nil {
			break
		}
		if v.owner(id) == s.self {
			if err := s.take(ctx, id); err != nil && !errors.Is(err, sessions.ErrNotFound) {
				left++
			}
		}
	}
	for peer, ids := range handover {
		for len(ids) > 0 && ctx.Err() == nil {
			n, kept := s.handover(ctx, peer, ids)
			left += kept
			ids = ids[n:]
		}
		left += len(ids)
	}
	for peer, ids := range copies {
		for len(ids) > 0 && ctx.Err() == nil {
			var recs []wireRecord
			budget := int(s.maxPeerMessage() / 2)
			n := 0
			for ; n < len(ids) && len(recs) < resyncBatch; n++ {
				rec, owned, ok := s.local.Export(ids[n])
				if !ok || !owned {
					continue
				}
				if budget -= wireSize(rec); budget < 0 && len(recs) > 0 {
					break
				}
				recs = append(recs, toWireRecord(rec))
			}
			ids = ids[n:]
			if len(recs) == 0 {
				continue
			}
			if _, err := s.send(ctx, peer, &peerRequest{Op: opReplicate, Records: recs}); err != nil {
				if s.peerDown(peer, err) {
					s.markDown(peer)
				}
				s.replicationFailed(peer, err)
			}
		}
	}
	return left
}

// handover moves the tokens of the first of ids that fit in one message
// to peer. It returns how many of ids it went through, and how many of
// those it could not hand over (they stay owned here).
func (s *Store) handover(ctx context.Context, peer string, ids []string) (n, kept int) {
	var (
		recs  []wireRecord
		moved []string
	)
	budget := int(s.maxPeerMessage() / 2)
	for ; n < len(ids) && len(recs) < resyncBatch; n++ {
		// Size from a look first: a demoted record must go in this batch.
		if rec, owned, ok := s.local.Export(ids[n]); ok && owned {
			if budget -= wireSize(rec); budget < 0 && len(recs) > 0 {
				break
			}
		}
		if rec, wasOwned, ok := s.local.Demote(ids[n]); ok && wasOwned {
			recs = append(recs, toWireRecord(rec))
			moved = append(moved, ids[n])
		}
	}
	if len(recs) == 0 {
		return n, 0
	}
	resp, err := s.send(ctx, peer, &peerRequest{Op: opHandover, Records: recs})
	if err != nil || len(resp.Errs) != len(recs) {
		if s.peerDown(peer, err) {
			s.markDown(peer)
		}
		s.log.Warn("sessions not handed over; kept", "peer", peer, "sessions", len(moved), "error", err)
		for _, id := range moved {
			s.local.Promote(id)
		}
		return n, len(moved)
	}
	for i, code := range resp.Errs {
		if code != "" {
			s.log.Warn("session not handed over; kept", "peer", peer, "error", code)
			s.local.Promote(moved[i])
			kept++
		}
	}
	return n, kept
}
