package browser

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kbprovider/backend/internal/binding/offers"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// offerDescription says in words what binding offer o gives the
// provider: its resources, each claim ("read and write Secrets labelled
// app=cowboy in your bound namespaces") and the namespaces it makes.
func offerDescription(o offers.Offer) string {
	var parts []string
	if o.Description != "" {
		parts = append(parts, o.Description)
	}
	if !o.Implicit || len(o.Resources) != 1 {
		var rs []string
		for _, r := range o.Resources {
			s := r.Resource
			if r.Group != "" {
				s += "." + r.Group
			}
			if len(r.Versions) > 0 {
				s += " (" + strings.Join(r.Versions, ", ") + ")"
			}
			rs = append(rs, s)
		}
		parts = append(parts, "APIs: "+strings.Join(rs, ", ")+".")
	}
	for _, c := range o.PermissionClaims {
		parts = append(parts, "The provider may read and write "+claimText(c)+" in your bound namespaces.")
	}
	if len(o.Namespaces) > 0 {
		var ns []string
		for _, n := range o.Namespaces {
			ns = append(ns, n.Name)
		}
		parts = append(parts, "Binds the namespaces "+strings.Join(ns, ", ")+".")
	}
	return strings.Join(parts, " ")
}

// overlapWarning goes with an offer that binds a resource the offers
// named others bind too.
func overlapWarning(others []string) string {
	return "Binds an API that " + strings.Join(others, " and ") + " also binds: pick only one of them."
}

// claimText names the objects a claim covers.
func claimText(c v1alpha2.PermissionClaim) string {
	what := c.Resource
	switch {
	case c.Group == "" && c.Resource == "secrets":
		what = "Secrets"
	case c.Group == "" && c.Resource == "configmaps":
		what = "ConfigMaps"
	case c.Group != "":
		what = c.Resource + "." + c.Group
	}
	sel := c.Selector
	var which []string
	if ls := sel.LabelSelector; ls != nil {
		keys := make([]string, 0, len(ls.MatchLabels))
		for k := range ls.MatchLabels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			which = append(which, k+"="+ls.MatchLabels[k])
		}
		for _, e := range ls.MatchExpressions {
			which = append(which, fmt.Sprintf("%s %s (%s)", e.Key, strings.ToLower(string(e.Operator)), strings.Join(e.Values, ", ")))
		}
	}
	var named []string
	for _, n := range sel.NamedResources {
		if n.Namespace != "" {
			named = append(named, n.Namespace+"/"+n.Name)
		} else {
			named = append(named, n.Name)
		}
	}
	switch {
	case len(which) > 0 && len(named) > 0:
		return what + " labelled " + strings.Join(which, ", ") + " or named " + strings.Join(named, ", ")
	case len(which) > 0:
		return what + " labelled " + strings.Join(which, ", ")
	case len(named) > 0:
		return what + " named " + strings.Join(named, ", ")
	case len(sel.References) > 0:
		return what + " referenced by your bound objects"
	}
	return "all " + what
}
