package longpoll

import "strings"

// maxDeltaSeconds is where delta-seconds saturate (RFC 9111 §1.2.2): a
// larger value counts as this one, and only the cap matters anyway.
const maxDeltaSeconds = 1 << 31

// PreferWait reads the wait preference from the values of the Prefer
// header fields of a request (RFC 7240: a comma-separated list of
// preferences, each a token with an optional "=" value and optional ";"
// parameters; the names are case-insensitive). Only the first wait
// preference counts (§2). ok is false when there is none, or when the
// first one is malformed or carries no delta-seconds: the preference is
// then ignored, as the RFC asks of preferences a server cannot read.
// Malformed list elements of other preferences are skipped.
func PreferWait(values []string) (seconds int64, ok bool) {
	for _, v := range values {
		for len(v) > 0 {
			var elem string
			elem, v = nextElement(v)
			name, value, hasValue, wellFormed := parsePreference(elem)
			if !wellFormed || !strings.EqualFold(name, "wait") {
				continue
			}
			if !hasValue {
				return 0, false
			}
			return deltaSeconds(value)
		}
	}
	return 0, false
}

// nextElement splits off the first list element of s: up to the first
// comma outside a quoted string.
func nextElement(s string) (elem, rest string) {
	quoted, escaped := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// parsePreference parses `token [ BWS "=" BWS word ] *( OWS ";" ... )`.
// The parameters after ";" are not read: a wait preference has none.
func parsePreference(e string) (name, value string, hasValue, ok bool) {
	e = trimOWS(e)
	n := tokenLen(e)
	if n == 0 {
		return "", "", false, false
	}
	name, e = e[:n], trimLeftOWS(e[n:])
	if strings.HasPrefix(e, "=") {
		e = trimLeftOWS(e[1:])
		if strings.HasPrefix(e, `"`) {
			var b strings.Builder
			i, closed := 1, false
			for ; i < len(e); i++ {
				c := e[i]
				if c == '\\' && i+1 < len(e) {
					i++
					b.WriteByte(e[i])
					continue
				}
				if c == '"' {
					closed = true
					break
				}
				b.WriteByte(c)
			}
			if !closed {
				return "", "", false, false
			}
			value, e = b.String(), e[i+1:]
		} else {
			m := tokenLen(e)
			if m == 0 {
				return "", "", false, false
			}
			value, e = e[:m], e[m:]
		}
		hasValue = true
	}
	if e = trimLeftOWS(e); e != "" && e[0] != ';' {
		return "", "", false, false
	}
	return name, value, hasValue, true
}

// deltaSeconds parses 1*DIGIT, saturating at maxDeltaSeconds.
func deltaSeconds(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < maxDeltaSeconds {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, maxDeltaSeconds), true
}

// tokenLen is the length of the RFC 9110 token at the start of s.
func tokenLen(s string) int {
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return i
		}
	}
	return len(s)
}

func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func trimLeftOWS(s string) string { return strings.TrimLeft(s, " \t") }

func trimOWS(s string) string { return strings.Trim(s, " \t") }
