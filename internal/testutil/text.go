package testutil

import "strings"

// GrepLines returns the lines of s that contain sub, for a failure
// message that shows only what matters of a long log.
func GrepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, strings.TrimSuffix(l, "\n"))
		}
	}
	return strings.Join(out, "\n")
}
