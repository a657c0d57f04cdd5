package hashring

import (
	"context"
	"errors"
	"sync"

	"github.com/golang/groupcache/lru"
	"github.com/golang/groupcache/singleflight"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// staticCache holds the static parts of sessions other replicas own, so a
// non-owner checks a poll's signature without asking the owner: the part
// never changes after Create, so a cached copy is never wrong, only
// possibly of a session that ended (the owner then answers not_found) or
// of an earlier session under the same ID (the owner compares digests and
// answers stale_static). It is bounded in bytes, least recently used out
// first; misses of the same ID are fetched once (singleflight).
type staticCache struct {
	mu       sync.Mutex
	lru      *lru.Cache
	bytes    int64
	maxBytes int64

	flight singleflight.Group
}

// staticEntry is a cached static part with its digest, computed once.
type staticEntry struct {
	sess   sessions.Session
	digest []byte
	size   int64
}

// staticEntryOverhead estimates what an entry costs besides its strings:
// the struct, the digest, the list element and the map slot.
const staticEntryOverhead = 200

func newStaticCache(maxBytes int64) *staticCache {
	c := &staticCache{lru: lru.New(0), maxBytes: maxBytes}
	c.lru.OnEvicted = func(_ lru.Key, v any) { c.bytes -= v.(*staticEntry).size }
	return c
}

func newStaticEntry(s sessions.Session) *staticEntry {
	s = s.StaticPart()
	d := memory.StaticDigest(s)
	return &staticEntry{sess: s, digest: d[:],
		size: int64(len(s.ID)*2 + len(s.ClusterID) + len(s.Secret) + len(s.CallbackURL) + len(s.CallbackSessionID) + staticEntryOverhead)}
}

func (c *staticCache) get(id string) (*staticEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.lru.Get(id)
	if !ok {
		return nil, false
	}
	return v.(*staticEntry), true
}

func (c *staticCache) add(e *staticEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Remove(e.sess.ID)
	if e.size > c.maxBytes {
		return
	}
	c.lru.Add(e.sess.ID, e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		c.lru.RemoveOldest()
	}
}

func (c *staticCache) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Remove(id)
}

func (c *staticCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// cacheStatic caches e unless the local store holds its session (owned,
// or the backup's copy, which Static answers from): the cache holds only
// what the local store does not, so with two replicas, where every
// replica holds every session, it stays empty.
func (s *Store) cacheStatic(e *staticEntry) {
	if _, held := s.local.Holds(e.sess.ID); !held {
		s.statics.add(e)
	}
}

// Static returns the session's static part: from the local store where
// it is held (as owner or as the backup's copy, so with two replicas the
// cache holds nothing the local store has), else from the cache, else
// fetched once from the owner (route: a replica whose ring names it owner
// but that does not hold the session yet takes it first).
func (s *Store) Static(ctx context.Context, id string) (sessions.Session, error) {
	if st, err := s.local.Static(ctx, id); err == nil {
		return st, nil
	}
	if s.Owner(id) != s.self {
		if e, ok := s.statics.get(id); ok {
			return e.sess, nil
		}
	}
	v, err := s.statics.flight.Do(id, func() (any, error) {
		resp, err := s.route(ctx, &peerRequest{Op: opStatic, ID: id})
		if err != nil {
			return nil, err
		}
		var p staticPart
		if err := wireJSON.Unmarshal(resp.Static, &p); err != nil || p.ID != id {
			return nil, &OwnerUnavailableError{Owner: s.Owner(id), Op: opStatic, Err: errors.New("the owner answered with another session's static part or none")}
		}
		e := newStaticEntry(p.session())
		s.cacheStatic(e)
		return e, nil
	})
	if err != nil {
		return sessions.Session{}, err
	}
	return v.(*staticEntry).sess, nil
}
