package testutil

import (
	"net/url"
	"reflect"
	"testing"
)

func TestParseFormsReadsWhatABrowserSends(t *testing.T) {
	page := []byte(`<html><body>
<input type="hidden" name="outside" value="x">
<form action="/interaction/1/login"><input name="login" value="ada"><input type="password" name="password"></form>
<form method="post" action="/bind?a=1&amp;b=2">
<input type="hidden" name="csrf" value="t&lt;1">
<input type="hidden" name="s" value="sid">
<input type="checkbox" name="api" value="a.example.com" checked>
<input type="checkbox" name="api" value="b.example.com">
<input type="radio" name="r" value="1"><input type="submit" name="go" value="Go">
<button type="submit" name="action" value="bind">Bind</button>
</form></body></html>`)
	forms, err := ParseForms(page)
	if err != nil {
		t.Fatal(err)
	}
	want := []Form{
		{Action: "/interaction/1/login", Method: "GET", Fields: url.Values{"login": {"ada"}, "password": {""}}, Checkboxes: map[string][]string{}},
		{Action: "/bind?a=1&b=2", Method: "POST", Fields: url.Values{"csrf": {"t<1"}, "s": {"sid"}},
			Checkboxes: map[string][]string{"api": {"a.example.com", "b.example.com"}}},
	}
	if !reflect.DeepEqual(forms, want) {
		t.Errorf("ParseForms:\n got %+v\nwant %+v", forms, want)
	}
	if f := FormOn(t, page, "POST"); f.Action != "/bind?a=1&b=2" {
		t.Errorf("FormOn POST: %+v", f)
	}
}

func TestGrepLines(t *testing.T) {
	log := "a Forbidden x\nfine\n\nb forbidden\nc Forbidden\n"
	if got, want := GrepLines(log, "orbidden"), "a Forbidden x\nb forbidden\nc Forbidden"; got != want {
		t.Errorf("GrepLines = %q, want %q", got, want)
	}
	if got := GrepLines(log, "nothing"); got != "" {
		t.Errorf("GrepLines without a match = %q", got)
	}
}
