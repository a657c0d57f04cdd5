package hashring

import (
	"encoding/base64"
	"unsafe"

	jsoniter "github.com/json-iterator/go"
)

// Hand-written JSON codecs for the messages every forwarded poll and every
// copy carries (the batches and their answers, peerRequest, peerResponse,
// wireRecord, wireSession): the
// same JSON as encoding/json writes and reads for their field tags (keys
// as written, omitempty as tagged, []byte as base64), without the
// reflection, and without hashing field names to find a field, which a
// struct of more than ten fields costs jsoniter on every key
// (BenchmarkWirePoll: about half the CPU of the reflection-based
// encoding). TestCodecsMatchEncodingJSON checks every field both ways
// against encoding/json: a field added to these structs must be added
// here too, or that test fails.
func init() {
	jsoniter.RegisterTypeEncoderFunc("hashring.peerRequest", func(p unsafe.Pointer, st *jsoniter.Stream) {
		encodeRequest((*peerRequest)(p), st)
	}, nil)
	jsoniter.RegisterTypeDecoderFunc("hashring.peerRequest", func(p unsafe.Pointer, it *jsoniter.Iterator) {
		decodeRequest((*peerRequest)(p), it)
	})
	jsoniter.RegisterTypeEncoderFunc("hashring.peerResponse", func(p unsafe.Pointer, st *jsoniter.Stream) {
		encodeResponse((*peerResponse)(p), st)
	}, nil)
	jsoniter.RegisterTypeDecoderFunc("hashring.peerResponse", func(p unsafe.Pointer, it *jsoniter.Iterator) {
		decodeResponse((*peerResponse)(p), it)
	})
	jsoniter.RegisterTypeEncoderFunc("hashring.wireRecord", func(p unsafe.Pointer, st *jsoniter.Stream) {
		encodeRecord((*wireRecord)(p), st)
	}, nil)
	jsoniter.RegisterTypeDecoderFunc("hashring.wireRecord", func(p unsafe.Pointer, it *jsoniter.Iterator) {
		decodeRecord((*wireRecord)(p), it)
	})
	jsoniter.RegisterTypeEncoderFunc("hashring.peerBatch", func(p unsafe.Pointer, st *jsoniter.Stream) {
		encodeBatchMessage((*peerBatch)(p), st)
	}, nil)
	jsoniter.RegisterTypeDecoderFunc("hashring.peerBatch", func(p unsafe.Pointer, it *jsoniter.Iterator) {
		decodeBatchMessage((*peerBatch)(p), it)
	})
	jsoniter.RegisterTypeEncoderFunc("hashring.peerBatchResponse", func(p unsafe.Pointer, st *jsoniter.Stream) {
		encodeBatchAnswer((*peerBatchResponse)(p), st)
	}, nil)
	jsoniter.RegisterTypeDecoderFunc("hashring.peerBatchResponse", func(p unsafe.Pointer, it *jsoniter.Iterator) {
		decodeBatchAnswer((*peerBatchResponse)(p), it)
	})
	jsoniter.RegisterTypeEncoderFunc("hashring.wireSession", func(p unsafe.Pointer, st *jsoniter.Stream) {
		encodeSession((*wireSession)(p), st)
	}, nil)
	jsoniter.RegisterTypeDecoderFunc("hashring.wireSession", func(p unsafe.Pointer, it *jsoniter.Iterator) {
		decodeSession((*wireSession)(p), it)
	})
}

// objectWriter writes the fields of one JSON object, commas included.
type objectWriter struct {
	st   *jsoniter.Stream
	more bool
}

func openObject(st *jsoniter.Stream) *objectWriter {
	st.WriteObjectStart()
	return &objectWriter{st: st}
}

func (w *objectWriter) key(k string) *jsoniter.Stream {
	if w.more {
		w.st.WriteMore()
	}
	w.more = true
	w.st.WriteObjectField(k)
	return w.st
}

func (w *objectWriter) close() { w.st.WriteObjectEnd() }

func (w *objectWriter) str(k, v string, omitEmpty bool) {
	if v != "" || !omitEmpty {
		w.key(k).WriteString(v)
	}
}

func (w *objectWriter) int64(k string, v int64) {
	if v != 0 {
		w.key(k).WriteInt64(v)
	}
}

func (w *objectWriter) uint64(k string, v uint64) {
	if v != 0 {
		w.key(k).WriteUint64(v)
	}
}

func (w *objectWriter) bool(k string, v bool) {
	if v {
		w.key(k).WriteTrue()
	}
}

// bytes writes v in base64 straight into the stream's buffer: base64
// needs no JSON escaping, and a string of it would be garbage at once.
func (w *objectWriter) bytes(k string, v []byte) {
	if len(v) > 0 {
		st := w.key(k)
		b := append(st.Buffer(), '"')
		st.SetBuffer(append(base64.StdEncoding.AppendEncode(b, v), '"'))
	}
}

func encodeRequest(r *peerRequest, st *jsoniter.Stream) {
	w := openObject(st)
	w.int64("t", r.Sent)
	w.str("op", r.Op, false)
	w.str("id", r.ID, true)
	w.str("n", r.Nonce, true)
	w.int64("i", r.Interval)
	w.str("r", r.Reason, true)
	w.bytes("b", r.Response)
	if r.Session != nil {
		encodeSession(r.Session, w.key("s"))
	}
	w.bytes("sd", r.StaticDigest)
	w.str("f", r.From, true)
	w.uint64("inc", r.Inc)
	w.bool("m", r.Member)
	w.bool("l", r.Left)
	w.int64("h", int64(r.Hop))
	if len(r.Records) > 0 {
		st := w.key("rs")
		st.WriteArrayStart()
		for i := range r.Records {
			if i > 0 {
				st.WriteMore()
			}
			encodeRecord(&r.Records[i], st)
		}
		st.WriteArrayEnd()
	}
	w.uint64("rq", r.Req)
	w.close()
}

func encodeResponse(r *peerResponse, st *jsoniter.Stream) {
	w := openObject(st)
	w.str("e", r.Err, true)
	w.int64("ra", r.RetryAfter)
	if r.Session != nil {
		encodeSession(r.Session, w.key("s"))
	}
	w.bytes("st", r.Static)
	w.bool("m", r.Member)
	w.bool("l", r.Left)
	w.uint64("inc", r.Inc)
	if r.Record != nil {
		encodeRecord(r.Record, w.key("rec"))
	}
	w.bool("o", r.Owned)
	if len(r.Errs) > 0 {
		st := w.key("es")
		st.WriteArrayStart()
		for i, e := range r.Errs {
			if i > 0 {
				st.WriteMore()
			}
			st.WriteString(e)
		}
		st.WriteArrayEnd()
	}
	if r.Copy != nil {
		encodeRecord(r.Copy, w.key("cp"))
	}
	w.close()
}

func encodeRecord(r *wireRecord, st *jsoniter.Stream) {
	w := openObject(st)
	if r.Session != nil {
		encodeSession(r.Session, w.key("s"))
	} else {
		w.key("s").WriteNil()
	}
	if len(r.Nonces) > 0 {
		st := w.key("n")
		st.WriteArrayStart()
		for i, h := range r.Nonces {
			if i > 0 {
				st.WriteMore()
			}
			st.WriteUint64(h)
		}
		st.WriteArrayEnd()
	}
	w.bool("p", r.Partial)
	w.uint64("ln", r.LastPollNonce)
	w.uint64("lr", r.LastPollRequest)
	w.bool("mu", r.Mutable)
	w.close()
}

func encodeSession(s *wireSession, st *jsoniter.Stream) {
	w := openObject(st)
	w.str("id", s.ID, false)
	w.str("c", s.ClusterID, true)
	w.str("k", s.Secret, true)
	w.int64("ca", s.CreatedAt)
	w.int64("ea", s.ExpiresAt)
	w.str("cu", s.CallbackURL, true)
	w.str("cs", s.CallbackSessionID, true)
	w.int64("st", int64(s.State))
	w.bytes("r", s.Response)
	w.str("dr", s.DenyReason, true)
	w.int64("da", s.DeliveredAt)
	w.int64("lp", s.LastPollAt)
	w.bytes("sd", s.StaticDigest)
	w.close()
}

// sender writes the fields of a batch's or an answer's sender.
func (w *objectWriter) sender(from Sender) {
	w.str("f", from.From, true)
	w.uint64("inc", from.Inc)
	w.bool("m", from.Member)
	w.bool("l", from.Left)
}

func encodeBatchMessage(b *peerBatch, st *jsoniter.Stream) {
	w := openObject(st)
	w.key("t").WriteInt64(b.Sent)
	w.sender(b.Sender)
	writeList(w.key("q"), b.Reqs, encodeRequest)
	w.close()
}

func encodeBatchAnswer(b *peerBatchResponse, st *jsoniter.Stream) {
	w := openObject(st)
	w.sender(b.Sender)
	writeList(w.key("a"), b.Resps, encodeResponse)
	w.close()
}

// writeList writes list as an array (nil: null; a nil element: null), as
// readList reads it.
func writeList[T any](st *jsoniter.Stream, list []*T, encode func(*T, *jsoniter.Stream)) {
	if list == nil {
		st.WriteNil()
		return
	}
	st.WriteArrayStart()
	for i, v := range list {
		if i > 0 {
			st.WriteMore()
		}
		if v == nil {
			st.WriteNil()
		} else {
			encode(v, st)
		}
	}
	st.WriteArrayEnd()
}

// encodeRequestJSON encodes r with its codec directly, without the
// reflection that finds it: done for every request sent.
func encodeRequestJSON(r *peerRequest) []byte {
	st := wireJSON.BorrowStream(nil)
	defer wireJSON.ReturnStream(st)
	encodeRequest(r, st)
	return append([]byte(nil), st.Buffer()...)
}

// The decoders read keys exactly as the encoders write them and skip
// unknown ones (a newer replica's fields). A null leaves a field as
// encoding/json does: pointers, slices and []byte become nil, other
// fields keep their value.

func decodeRequest(r *peerRequest, it *jsoniter.Iterator) {
	it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
		switch k {
		case "t":
			readInt64(it, &r.Sent)
		case "op":
			readString(it, &r.Op)
		case "id":
			readString(it, &r.ID)
		case "n":
			readString(it, &r.Nonce)
		case "i":
			readInt64(it, &r.Interval)
		case "r":
			readString(it, &r.Reason)
		case "b":
			readBytes(it, &r.Response)
		case "s":
			readSession(it, &r.Session)
		case "sd":
			readBytes(it, &r.StaticDigest)
		case "f":
			readString(it, &r.From)
		case "inc":
			readUint64(it, &r.Inc)
		case "m":
			readBool(it, &r.Member)
		case "l":
			readBool(it, &r.Left)
		case "h":
			var h int64
			readInt64(it, &h)
			if int64(int(h)) != h {
				it.ReportError("decode peer request", "hop count out of range")
			}
			r.Hop = int(h)
		case "rs":
			if it.ReadNil() {
				r.Records = nil
				break
			}
			r.Records = r.Records[:0]
			it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
				r.Records = append(r.Records, wireRecord{})
				decodeRecord(&r.Records[len(r.Records)-1], it)
				return it.Error == nil
			})
		case "rq":
			readUint64(it, &r.Req)
		default:
			it.Skip()
		}
		return it.Error == nil
	})
}

func decodeResponse(r *peerResponse, it *jsoniter.Iterator) {
	it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
		switch k {
		case "e":
			readString(it, &r.Err)
		case "ra":
			readInt64(it, &r.RetryAfter)
		case "s":
			readSession(it, &r.Session)
		case "st":
			readBytes(it, &r.Static)
		case "m":
			readBool(it, &r.Member)
		case "l":
			readBool(it, &r.Left)
		case "inc":
			readUint64(it, &r.Inc)
		case "rec":
			readRecord(it, &r.Record)
		case "o":
			readBool(it, &r.Owned)
		case "es":
			if it.ReadNil() {
				r.Errs = nil
				break
			}
			r.Errs = r.Errs[:0]
			it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
				var e string
				readString(it, &e)
				r.Errs = append(r.Errs, e)
				return it.Error == nil
			})
		case "cp":
			readRecord(it, &r.Copy)
		default:
			it.Skip()
		}
		return it.Error == nil
	})
}

func decodeRecord(r *wireRecord, it *jsoniter.Iterator) {
	it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
		switch k {
		case "s":
			readSession(it, &r.Session)
		case "n":
			if it.ReadNil() {
				r.Nonces = nil
				break
			}
			r.Nonces = r.Nonces[:0]
			it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
				var h uint64
				readUint64(it, &h)
				r.Nonces = append(r.Nonces, h)
				return it.Error == nil
			})
		case "p":
			readBool(it, &r.Partial)
		case "ln":
			readUint64(it, &r.LastPollNonce)
		case "lr":
			readUint64(it, &r.LastPollRequest)
		case "mu":
			readBool(it, &r.Mutable)
		default:
			it.Skip()
		}
		return it.Error == nil
	})
}

func decodeSession(s *wireSession, it *jsoniter.Iterator) {
	it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
		switch k {
		case "id":
			readString(it, &s.ID)
		case "c":
			readString(it, &s.ClusterID)
		case "k":
			readString(it, &s.Secret)
		case "ca":
			readInt64(it, &s.CreatedAt)
		case "ea":
			readInt64(it, &s.ExpiresAt)
		case "cu":
			readString(it, &s.CallbackURL)
		case "cs":
			readString(it, &s.CallbackSessionID)
		case "st":
			var n int64
			readInt64(it, &n)
			if int64(int(n)) != n {
				it.ReportError("decode session", "state out of range")
			}
			s.State = int(n)
		case "r":
			readBytes(it, &s.Response)
		case "dr":
			readString(it, &s.DenyReason)
		case "da":
			readInt64(it, &s.DeliveredAt)
		case "lp":
			readInt64(it, &s.LastPollAt)
		case "sd":
			readBytes(it, &s.StaticDigest)
		default:
			it.Skip()
		}
		return it.Error == nil
	})
}

// readSender reads a field of a batch's or an answer's sender; false if
// k is not one.
func readSender(it *jsoniter.Iterator, k string, from *Sender) bool {
	switch k {
	case "f":
		readString(it, &from.From)
	case "inc":
		readUint64(it, &from.Inc)
	case "m":
		readBool(it, &from.Member)
	case "l":
		readBool(it, &from.Left)
	default:
		return false
	}
	return true
}

func decodeBatchMessage(b *peerBatch, it *jsoniter.Iterator) {
	it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
		switch {
		case k == "t":
			readInt64(it, &b.Sent)
		case k == "q":
			b.Reqs = readList(it, b.Reqs[:0], decodeRequest)
		case !readSender(it, k, &b.Sender):
			it.Skip()
		}
		return it.Error == nil
	})
}

func decodeBatchAnswer(b *peerBatchResponse, it *jsoniter.Iterator) {
	it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
		switch {
		case k == "a":
			b.Resps = readList(it, b.Resps[:0], decodeResponse)
		case !readSender(it, k, &b.Sender):
			it.Skip()
		}
		return it.Error == nil
	})
}

// readList reads an array of objects into list (null: nil; a null
// element: a nil pointer, which the batch's checks refuse).
func readList[T any](it *jsoniter.Iterator, list []*T, decode func(*T, *jsoniter.Iterator)) []*T {
	if it.ReadNil() {
		return nil
	}
	if !next(it, jsoniter.ArrayValue) {
		return list
	}
	if list == nil {
		list = make([]*T, 0, 16) // [] is not null
	}
	it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
		if it.ReadNil() {
			list = append(list, nil)
			return true
		}
		v := new(T)
		decode(v, it)
		list = append(list, v)
		return it.Error == nil
	})
	return list
}

// next reports whether the value is there to read: false after reading a
// null (which leaves a scalar as it is), or after a value of another type
// (reported as an error, as encoding/json does).
func next(it *jsoniter.Iterator, want jsoniter.ValueType) bool {
	switch got := it.WhatIsNext(); {
	case got == want:
		return true
	case got == jsoniter.NilValue:
		it.ReadNil()
	default:
		it.ReportError("decode peer message", "a field of the wrong type")
	}
	return false
}

func readString(it *jsoniter.Iterator, v *string) {
	if next(it, jsoniter.StringValue) {
		*v = it.ReadString()
	}
}

func readInt64(it *jsoniter.Iterator, v *int64) {
	if next(it, jsoniter.NumberValue) {
		*v = it.ReadInt64()
	}
}

func readUint64(it *jsoniter.Iterator, v *uint64) {
	if next(it, jsoniter.NumberValue) {
		*v = it.ReadUint64()
	}
}

func readBool(it *jsoniter.Iterator, v *bool) {
	if next(it, jsoniter.BoolValue) {
		*v = it.ReadBool()
	}
}

func readBytes(it *jsoniter.Iterator, v *[]byte) {
	if it.WhatIsNext() == jsoniter.NilValue {
		it.ReadNil()
		*v = nil
		return
	}
	if !next(it, jsoniter.StringValue) {
		return
	}
	// Read in place (no string of it), decoded into one buffer. Base64 as
	// replicas write it has no escapes; one with escapes is refused (the
	// backslash is no base64), never misread.
	b, err := base64.StdEncoding.AppendDecode(nil, it.ReadStringAsSlice())
	if err != nil {
		it.ReportError("decode peer message", "invalid base64")
		return
	}
	if b == nil {
		b = []byte{} // "" is not null
	}
	*v = b
}

func readSession(it *jsoniter.Iterator, v **wireSession) {
	if it.ReadNil() {
		*v = nil
		return
	}
	if *v == nil {
		*v = &wireSession{}
	}
	decodeSession(*v, it)
}

func readRecord(it *jsoniter.Iterator, v **wireRecord) {
	if it.ReadNil() {
		*v = nil
		return
	}
	if *v == nil {
		*v = &wireRecord{}
	}
	decodeRecord(*v, it)
}
