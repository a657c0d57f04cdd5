package hashring

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"
)

// Peer streams. A replica sends its batches to a peer over one long-lived
// connection, upgraded from HTTP (PeerStreamPath), instead of one HTTP
// exchange each: the request, its headers, the transport's goroutines and
// the server's per-request work were about a fifth of what a forwarded
// poll cost the two replicas (docs/sessions-hashring.md). On a stream:
//
//   - every frame is sealed under additional data that names the
//     connection (a nonce of each side, exchanged in the upgrade), the
//     direction and the frame's sequence number, so a frame is accepted
//     once, in order, on its own connection only: no replay cache;
//   - the receiver answers a batch's requests that wait for nobody in one
//     frame (the ack) and each of the others in a frame of its own when it
//     is done. The sender's pipe counts the batch as answered at the ack,
//     so a request that waits for a third replica holds up nobody: leaf and
//     session requests share one pipe and one batch (pipe.go), which halved
//     the messages of the two-replica benchmark;
//   - the receiver may ask the sender to stop (goaway, when its peer API
//     shuts down): the sender sends nothing more there, and closes the
//     connection once its requests are answered.
//
// A peer that does not serve streams (a replica of before them answers
// the upgrade 404) gets HTTP messages, as before, and is asked again after
// streamRetry.

// PeerStreamPath is where PeerHandler upgrades a connection to a stream.
const PeerStreamPath = PeerPath + "/stream"

const (
	streamProtocol = "kb-sessions-peer-stream/1"
	// headerStreamNonce (request) and headerStreamChallenge (101 answer)
	// carry each side's random part of the connection's name.
	headerStreamNonce     = "Kb-Stream-Nonce"
	headerStreamChallenge = "Kb-Stream-Challenge"
	streamNonceBytes      = 16
)

// Frame kinds, the first byte of a frame's plaintext.
const (
	frameBatch  = 'B' // sender → receiver: seq implicit, then a peerBatch
	frameAck    = 'A' // receiver → sender: batch seq, then a peerBatchResponse, null where answered later
	frameLater  = 'L' // receiver → sender: batch seq, index (2 bytes), then a peerBatchResponse of one answer
	frameGoaway = 'G' // receiver → sender: send nothing more here
)

// Directions, in the additional data.
const (
	dirToReceiver = 'q'
	dirToSender   = 'a'
)

const (
	// streamRetry is how long a replica sends HTTP messages to a peer that
	// refused a stream (or could not be reached) before it asks again.
	streamRetry = 5 * time.Second
	// streamSenderIdle closes a stream the sender has not used for this
	// long. It is shorter than the receiver's streamReceiverIdle, so the
	// sender, not the receiver, closes an idle stream: a batch is never
	// written to a connection the receiver is closing.
	streamSenderIdle   = 60 * time.Second
	streamReceiverIdle = 120 * time.Second
	// streamAuthTimeout is how long the receiver waits for the first frame
	// of an upgraded connection: until then it does not know that a
	// replica holding the key is at the other end.
	streamAuthTimeout = 5 * time.Second
	// maxReceiverStreams bounds the streams one replica serves: each peer
	// opens one, and the replicas of a ring are few. Beyond it, an
	// upgrade is refused (503) and the sender uses HTTP messages.
	maxReceiverStreams = 64
	// maxStreamWorkers bounds the requests of one stream being served on
	// workers (those that may wait for another replica): as many as a
	// pipe's batches in flight may carry. The receiver reads no further
	// frame while it is reached, so a sender cannot pile up work.
	maxStreamWorkers = maxInFlight * maxBatch
	// frameHeaderBytes is the length prefix of a frame.
	frameHeaderBytes = 4
	// frameSeqBytes is a batch's sequence number in an ack or a later.
	frameSeqBytes = 8
)

var (
	errNoStream     = errors.New("peer does not serve streams")
	errStreamClosed = errors.New("peer stream closed")
	errFrame        = errors.New("malformed peer stream frame")
	errFrameTooLong = errors.New("peer stream frame too large")
	errFrameCut     = errors.New("peer stream stalled within a frame")
)

// streamAAD returns the additional data of frame seq in direction dir of
// connection id.
func streamAAD(buf []byte, id []byte, dir byte, seq uint64) []byte {
	buf = append(buf[:0], streamProtocol...)
	buf = append(buf, dir)
	buf = append(buf, id...)
	return binary.BigEndian.AppendUint64(buf, seq)
}

// sealFrame returns the length prefix and the sealed plaintext, ready to
// be written in one call.
func (s *sealer) sealFrame(plaintext, aad []byte) []byte {
	sealed := s.sealTo(make([]byte, frameHeaderBytes, frameHeaderBytes+gcmNonceSize+len(plaintext)+s.aead.Overhead()), plaintext, aad)
	binary.BigEndian.PutUint32(sealed, uint32(len(sealed)-frameHeaderBytes))
	return sealed
}

// readFrame reads one frame's sealed bytes, of at most limit bytes. An
// error from the connection before the frame's first byte is returned as
// it is (a timeout then leaves the stream intact); one within a frame is
// errFrameCut, or io.ErrUnexpectedEOF.
func readFrame(r *bufio.Reader, limit int64) ([]byte, error) {
	if _, err := r.Peek(1); err != nil {
		return nil, err
	}
	var head [frameHeaderBytes]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, cutShort(err)
	}
	n := int64(binary.BigEndian.Uint32(head[:]))
	if n > limit {
		return nil, errFrameTooLong
	}
	if n < gcmNonceSize+16 { // the GCM tag
		return nil, errFrame
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, cutShort(err)
	}
	return buf, nil
}

// cutShort is the error of a frame the connection ended or stalled in:
// the stream cannot go on.
func cutShort(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return io.ErrUnexpectedEOF
	case errors.As(err, &ne) && ne.Timeout():
		return errFrameCut
	}
	return err
}

// answerFrame is the plaintext of an ack or a later: kind, the batch's
// sequence number, for a later the request's index, then the answers.
func answerFrame(kind byte, seq uint64, index int, answer *peerBatchResponse) []byte {
	head := make([]byte, 0, 1+frameSeqBytes+2)
	head = append(head, kind)
	head = binary.BigEndian.AppendUint64(head, seq)
	if kind == frameLater {
		head = binary.BigEndian.AppendUint16(head, uint16(index))
	}
	return append(head, mustJSON(answer)...)
}

// parsedAnswer is an ack or a later as the sender reads it.
type parsedAnswer struct {
	kind  byte
	seq   uint64
	index int // a later's
	resps []*peerResponse
}

// parseAnswerFrame parses the plaintext of a frame to the sender. An ack
// has an answer or null for each request of its batch (checked by the
// sender, which knows their number); a later has exactly one answer.
func parseAnswerFrame(plain []byte) (parsedAnswer, error) {
	if len(plain) == 0 {
		return parsedAnswer{}, errFrame
	}
	p := parsedAnswer{kind: plain[0]}
	switch p.kind {
	case frameGoaway:
		return p, nil
	case frameAck, frameLater:
	default:
		return p, errFrame
	}
	plain = plain[1:]
	if len(plain) < frameSeqBytes {
		return p, errFrame
	}
	p.seq = binary.BigEndian.Uint64(plain)
	plain = plain[frameSeqBytes:]
	if p.kind == frameLater {
		if len(plain) < 2 {
			return p, errFrame
		}
		p.index = int(binary.BigEndian.Uint16(plain))
		plain = plain[2:]
	}
	var b peerBatchResponse
	if err := wireJSON.Unmarshal(plain, &b); err != nil {
		return p, err
	}
	if len(b.Resps) == 0 || len(b.Resps) > maxBatch || p.kind == frameLater && (len(b.Resps) != 1 || b.Resps[0] == nil) {
		return p, errFrame
	}
	b.fillSender()
	p.resps = b.Resps
	return p, nil
}
