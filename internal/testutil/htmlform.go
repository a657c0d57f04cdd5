package testutil

import (
	"bytes"
	"net/url"
	"strings"

	"golang.org/x/net/html"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// Form is an HTML form as a browser would submit it.
type Form struct {
	// Action is as the page writes it (resolve it against the page's URL);
	// Method is upper case, GET when the page names none.
	Action, Method string
	// Fields holds the values of the named inputs a browser sends as they
	// are (hidden, text, password, ...): not buttons, checkboxes or radio
	// buttons.
	Fields url.Values
	// Checkboxes holds the values each checkbox name offers.
	Checkboxes map[string][]string
}

// ParseForms returns the forms of an HTML page, in the page's order.
func ParseForms(page []byte) ([]Form, error) {
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		return nil, err
	}
	var forms []Form
	var walk func(n *html.Node, in int)
	walk = func(n *html.Node, in int) {
		if n.Type == html.ElementNode {
			switch n.Data {
			case "form":
				method := strings.ToUpper(attr(n, "method"))
				if method == "" {
					method = "GET"
				}
				forms = append(forms, Form{Action: attr(n, "action"), Method: method, Fields: url.Values{}, Checkboxes: map[string][]string{}})
				in = len(forms) - 1
			case "input":
				if name := attr(n, "name"); in >= 0 && name != "" {
					f := &forms[in]
					switch strings.ToLower(attr(n, "type")) {
					case "submit", "button", "image", "reset", "radio":
					case "checkbox":
						f.Checkboxes[name] = append(f.Checkboxes[name], attr(n, "value"))
					default:
						f.Fields.Add(name, attr(n, "value"))
					}
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c, in)
		}
	}
	walk(doc, -1)
	return forms, nil
}

// FormOn returns the first form of page whose method is method, failing
// the test (and showing the page) when there is none.
func FormOn(t tb.TB, page []byte, method string) Form {
	t.Helper()
	forms, err := ParseForms(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forms {
		if f.Method == method {
			return f
		}
	}
	t.Fatalf("no %s form on the page:\n%.2000s", method, page)
	return Form{}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}
