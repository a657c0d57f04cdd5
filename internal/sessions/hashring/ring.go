package hashring

import (
	"hash/crc32"
	"slices"
	"strconv"
)

// ring places session IDs on members exactly as groupcache's
// consistenthash.Map does with its default hash (CRC-32 IEEE, virtual
// nodes hashed as decimal index then member, a later member taking a
// point two share), because every replica, whatever its version, must
// name the same owner. It differs in looking an ID up without
// allocating: consistenthash converts the ID to a byte slice that escapes
// to its hash function, an allocation for every owner and backup looked
// up, of which a forwarded poll makes several (about a fifth of the
// objects a non-owner allocated per poll). TestRingPlacesAsConsistentHash
// holds it to consistenthash's placement.
type ring struct {
	points []uint32 // sorted, distinct
	owners []string // owners[i] holds points[i]
}

func newRing(members []string, virtual int) *ring {
	at := make(map[uint32]string, len(members)*virtual)
	for _, m := range members {
		for i := 0; i < virtual; i++ {
			at[crc32.ChecksumIEEE([]byte(strconv.Itoa(i)+m))] = m
		}
	}
	r := &ring{points: make([]uint32, 0, len(at)), owners: make([]string, 0, len(at))}
	for p := range at {
		r.points = append(r.points, p)
	}
	slices.Sort(r.points)
	for _, p := range r.points {
		r.owners = append(r.owners, at[p])
	}
	return r
}

// get returns the member holding the first point at or after id's hash,
// going round; "" on an empty ring.
func (r *ring) get(id string) string {
	if len(r.points) == 0 {
		return ""
	}
	i, _ := slices.BinarySearch(r.points, crc32String(id))
	if i == len(r.points) {
		i = 0
	}
	return r.owners[i]
}

// crc32String is crc32.ChecksumIEEE of s, without converting s to a
// slice (which escapes there).
func crc32String(s string) uint32 {
	crc := ^uint32(0)
	for i := 0; i < len(s); i++ {
		crc = crc32.IEEETable[byte(crc)^s[i]] ^ crc>>8
	}
	return ^crc
}
