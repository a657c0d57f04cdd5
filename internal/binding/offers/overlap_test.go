package offers_test

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kbprovider/backend/internal/binding/offers"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// The offers of the released CLI's bug: a template of widgets, the CRD's
// own implicit offer, and an unrelated one.
var (
	widgetsRes  = v1alpha2.Resource{Group: "interop.example.com", Resource: "widgets", Versions: []string{"v1"}}
	widgetsCRD  = offers.Offer{Name: "widgets.interop.example.com", Implicit: true, Resources: []v1alpha2.Resource{widgetsRes}, SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways}
	widgetsTmpl = offers.Offer{Name: "widgets", Resources: []v1alpha2.Resource{widgetsRes}, SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways}
	mangoCRD    = offers.Offer{Name: "mangodbs.mangodb.com", Implicit: true, Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs", Versions: []string{"v1"}}}}
	widgetsGR   = schema.GroupResource{Group: "interop.example.com", Resource: "widgets"}
)

// TestFirstOverlap: two offers holding one resource overlap, in either
// order, named in the order given; distinct offers and one offer given
// twice do not.
func TestFirstOverlap(t *testing.T) {
	both := offers.Offer{Name: "both", Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs"}, widgetsRes}}
	for _, c := range []struct {
		picked []offers.Offer
		want   offers.Overlap
		ok     bool
	}{
		{[]offers.Offer{widgetsTmpl, widgetsCRD}, offers.Overlap{First: "widgets", Second: "widgets.interop.example.com", Resource: widgetsGR}, true},
		{[]offers.Offer{widgetsCRD, mangoCRD, widgetsTmpl}, offers.Overlap{First: "widgets.interop.example.com", Second: "widgets", Resource: widgetsGR}, true},
		// A template of two resources overlaps with the implicit offer of
		// its second one (versions do not matter: a namespace binds a
		// resource once).
		{[]offers.Offer{mangoCRD, both}, offers.Overlap{First: "mangodbs.mangodb.com", Second: "both", Resource: schema.GroupResource{Group: "mangodb.com", Resource: "mangodbs"}}, true},
		{[]offers.Offer{widgetsTmpl, mangoCRD}, offers.Overlap{}, false},
		{[]offers.Offer{widgetsCRD, mangoCRD}, offers.Overlap{}, false},
		{[]offers.Offer{widgetsTmpl, widgetsTmpl}, offers.Overlap{}, false},
		{nil, offers.Overlap{}, false},
	} {
		got, ok := offers.FirstOverlap(c.picked)
		if ok != c.ok || got != c.want {
			t.Errorf("FirstOverlap(%v) = %+v, %v; want %+v, %v", names(c.picked), got, ok, c.want, c.ok)
		}
	}
}

// TestOverlapping names, for each offer, the others that share a resource
// with it.
func TestOverlapping(t *testing.T) {
	claims := widgetsTmpl
	claims.Name = "widgets-with-secrets"
	claims.PermissionClaims = []v1alpha2.PermissionClaim{{Resource: "secrets"}}
	got := offers.Overlapping([]offers.Offer{claims, mangoCRD, widgetsCRD, widgetsTmpl})
	want := map[string][]string{
		"widgets":                     {"widgets-with-secrets", "widgets.interop.example.com"},
		"widgets-with-secrets":        {"widgets", "widgets.interop.example.com"},
		"widgets.interop.example.com": {"widgets", "widgets-with-secrets"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Overlapping = %v, want %v", got, want)
	}
}

// TestDistinct: an implicit offer that a template repeats exactly is left
// out; one that grants less than the template (no claims), or other
// versions, stays; templates always stay.
func TestDistinct(t *testing.T) {
	if got := names(offers.Distinct([]offers.Offer{mangoCRD, widgetsTmpl, widgetsCRD})); !reflect.DeepEqual(got, []string{"mangodbs.mangodb.com", "widgets"}) {
		t.Errorf("a template repeating the CRD's offer: %v, want the CRD's offer left out", got)
	}
	claims := widgetsTmpl
	claims.PermissionClaims = []v1alpha2.PermissionClaim{{Resource: "secrets"}}
	older := widgetsTmpl
	older.Resources = []v1alpha2.Resource{{Group: widgetsRes.Group, Resource: widgetsRes.Resource, Versions: []string{"v1beta1"}}}
	never := widgetsTmpl
	never.SchemaUpdatePolicy = v1alpha2.SchemaUpdateNever
	two := widgetsTmpl
	two.Resources = append(two.Resources, mangoCRD.Resources...)
	for what, tmpl := range map[string]offers.Offer{"claims": claims, "other versions": older, "another schema policy": never, "two resources": two} {
		if got := names(offers.Distinct([]offers.Offer{widgetsCRD, tmpl})); !reflect.DeepEqual(got, []string{"widgets.interop.example.com", "widgets"}) {
			t.Errorf("a template with %s: %v, want both offers", what, got)
		}
	}
}

func names(list []offers.Offer) []string {
	var out []string
	for _, o := range list {
		out = append(out, o.Name)
	}
	return out
}
