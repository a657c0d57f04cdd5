package memory

import "math/bits"

// nonceSet remembers the seeded 64-bit hashes of a session's used nonces in
// an open-addressing table with linear probing. The table grows by
// doubling while it is at most three quarters full, but never beyond
// limit slots: a full set of limit nonces costs limit × 8 bytes of heap and
// nothing more (a Go map of the same hashes costs several times that).
// Near the limit the table fills completely, so a lookup may probe up to
// limit slots: well under a microsecond for the default 1024.
//
// Zero marks an empty slot; a hash that is zero is stored as one, which
// like any collision can only refuse a fresh nonce, never accept a used one.
type nonceSet struct {
	slots []uint64
	n     int
}

func (s *nonceSet) len() int { return s.n }

func nonEmpty(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// slot maps h onto [0, size) without a division (Lemire's multiply-shift).
func slot(h uint64, size int) int {
	hi, _ := bits.Mul64(h, uint64(size))
	return int(hi)
}

func (s *nonceSet) has(h uint64) bool {
	h = nonEmpty(h)
	size := len(s.slots)
	if size == 0 {
		return false
	}
	for i, probes := slot(h, size), 0; probes < size; probes++ {
		switch s.slots[i] {
		case h:
			return true
		case 0:
			return false
		}
		if i++; i == size {
			i = 0
		}
	}
	return false
}

// add inserts h, which must not be in the set, and reports false when the
// set already holds limit hashes.
func (s *nonceSet) add(h uint64, limit int) bool {
	if s.n >= limit {
		return false
	}
	if size := len(s.slots); size < limit && (s.n+1)*4 > size*3 {
		s.grow(min(max(2*size, 8), limit))
	}
	s.insert(nonEmpty(h))
	s.n++
	return true
}

func (s *nonceSet) grow(size int) {
	old := s.slots
	s.slots = make([]uint64, size)
	for _, h := range old {
		if h != 0 {
			s.insert(h)
		}
	}
}

// insert puts h into the first free slot from its home; there is one, as
// n < len(slots).
func (s *nonceSet) insert(h uint64) {
	size := len(s.slots)
	i := slot(h, size)
	for s.slots[i] != 0 {
		if i++; i == size {
			i = 0
		}
	}
	s.slots[i] = h
}
