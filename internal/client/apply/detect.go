package apply

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
)

// KbindV2CRDs are the CRDs of kbind v2's konnector (API group
// core.kbind.io), which a chart installs beside it.
var KbindV2CRDs = []string{"connections.core.kbind.io", "clusterbindings.core.kbind.io", "bindings.core.kbind.io"}

// firstKbindV2 is the first konnector release of kbind v2, which binds
// through core.kbind.io instead of kube-bind.io.
var firstKbindV2 = version.MustParseSemantic("v2.0.0-alpha.0")

// Found is what the consumer cluster shows of a konnector already there.
type Found struct {
	// Image of Deployment kube-bind/konnector; "" when there is none.
	Image string
	// Served are the versions (v1alpha1, v1alpha2) the APIServiceBinding
	// CRD serves; nil when the CRD is not installed.
	Served []string
	// KbindV2 are kbind v2's CRDs found in the cluster.
	KbindV2 []string
}

// Detect reads what the cluster shows of a konnector: its Deployment, the
// versions its APIServiceBinding CRD serves, and kbind v2's CRDs. It
// changes nothing.
func (bd *Binder) Detect(ctx context.Context) (Found, error) {
	var f Found
	d, err := bd.kube.AppsV1().Deployments(Namespace).Get(ctx, KonnectorName, metav1.GetOptions{})
	switch {
	case err == nil:
		if cs := d.Spec.Template.Spec.Containers; len(cs) > 0 {
			f.Image = cs[0].Image
		}
	case !apierrors.IsNotFound(err):
		return f, fmt.Errorf("reading Deployment %s/%s: %w", Namespace, KonnectorName, err)
	}
	crds := bd.crds.ApiextensionsV1().CustomResourceDefinitions()
	crd, err := crds.Get(ctx, BindingCRDName, metav1.GetOptions{})
	switch {
	case err == nil:
		f.Served = []string{}
		for _, v := range crd.Spec.Versions {
			if v.Served {
				f.Served = append(f.Served, v.Name)
			}
		}
	case !apierrors.IsNotFound(err):
		return f, fmt.Errorf("reading CRD %s: %w", BindingCRDName, err)
	}
	for _, name := range KbindV2CRDs {
		_, err := crds.Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			f.KbindV2 = append(f.KbindV2, name)
		case !apierrors.IsNotFound(err):
			return f, fmt.Errorf("reading CRD %s: %w", name, err)
		}
	}
	return f, nil
}

// Fit is which protocol generations a bind into the cluster can take,
// given the konnector found there and the one the bind would leave
// running, and why not the others.
type Fit struct {
	// Konnector says in one line what was found.
	Konnector string
	refused   map[string]string
	notes     map[string]string
}

// UnfitError is a generation the cluster's konnector cannot serve, with
// what to do instead.
type UnfitError struct {
	Protocol string
	Reason   string
}

func (e *UnfitError) Error() string { return e.Reason }

// Allows returns nil when a bind through protocol fits the cluster, else
// an *UnfitError that says why and what to do.
func (f *Fit) Allows(protocol string) error {
	if why, ok := f.refused[protocol]; ok {
		return &UnfitError{Protocol: protocol, Reason: why}
	}
	return nil
}

// Note says what a bind through protocol does to the konnector, when
// that is worth saying before the browser step ("" otherwise).
func (f *Fit) Note(protocol string) string { return f.notes[protocol] }

// Fit decides, from what Detect found, which generations a bind can take.
func (bd *Binder) Fit(found Found) *Fit {
	return fitOf(found, bd.o.SkipKonnector, bd.o.KonnectorImage)
}

// servedBy is the kube-bind.io versions whose APIServiceBindings a
// konnector of generation kgen serves: v0.4 installs a CRD of v1alpha1
// only, v0.5 and newer one that serves both.
func servedBy(kgen generation) []string {
	if kgen.protocol == ProtocolV1alpha1 {
		return []string{"v1alpha1"}
	}
	return []string{"v1alpha1", "v1alpha2"}
}

func isKbindV2(image string) bool {
	v, err := version.ParseSemantic(tag(image))
	return err == nil && v.AtLeast(firstKbindV2)
}

// fitOf is Fit's decision. A bind through a generation fits when the
// konnector that will serve its APIServiceBindings serves their version:
// without skipKonnector the one the bind deploys or keeps (planKonnector's
// rule), with it the one found, by its image tag, else by the CRD it
// installed; a cluster with neither may take any.
func fitOf(found Found, skipKonnector bool, konnectorImage string) *Fit {
	f := &Fit{refused: map[string]string{}, notes: map[string]string{}, Konnector: describeFound(found)}
	kbindV2Note := ""
	if len(found.KbindV2) > 0 {
		kbindV2Note = "this cluster has kbind v2's CRDs (" + strings.Join(found.KbindV2, ", ") + "); its konnector binds through " +
			"core.kbind.io, which this client does not bind through yet"
	}
	for _, gen := range []generation{genV1alpha1, genV1alpha2} {
		p, gv := gen.protocol, gen.groupVersion
		if isKbindV2(found.Image) {
			f.refused[p] = fmt.Sprintf("the konnector in this cluster (%s) is kbind v2's: it binds through core.kbind.io, which this client "+
				"does not bind through yet, and serves no %s APIServiceBindings; bind with kbind's own tools", found.Image, BindingGVR.Group)
			continue
		}
		if !skipKonnector {
			image := konnectorImage
			if image == "" {
				image = gen.konnector
			}
			kept := found.Image != "" && !newer(image, found.Image)
			running := image
			if kept {
				running = found.Image
			}
			if !slices.Contains(servedBy(konnectorGeneration(running, gen)), gen.bindingGVR.Version) {
				if kept {
					// Not reached with the default images: a kept konnector is
					// of the same or a newer version than the generation's.
					f.refused[p] = fmt.Sprintf("the konnector in this cluster (%s) serves only %s APIServiceBindings and is kept "+
						"(it is not older than %s); replace it by hand", running, v1alpha1GV, image)
				} else {
					f.refused[p] = fmt.Sprintf("--konnector-image %s (%s) serves only %s APIServiceBindings, not %s; "+
						"pass a konnector v0.5 or newer", image, versionOf(image), v1alpha1GV, gv)
				}
				continue
			}
			switch {
			case found.Image != "" && !kept:
				f.notes[p] = fmt.Sprintf("the bind replaces the konnector in this cluster (%s) by %s", found.Image, image)
				if p == ProtocolV1alpha2 && konnectorGeneration(found.Image, gen).protocol == ProtocolV1alpha1 {
					f.notes[p] += " (it serves only " + v1alpha1GV + "; --protocol " + ProtocolV1alpha1 + " keeps it)"
				}
			case kbindV2Note != "":
				f.notes[p] = kbindV2Note + "; the bind deploys kube-bind's konnector for " + gv + " next to it"
			}
			continue
		}
		// --skip-konnector: the konnector found stays as it is.
		var served []string
		var which string
		switch {
		case found.Image != "" && isVersion(found.Image):
			served = servedBy(konnectorGeneration(found.Image, gen))
			which = fmt.Sprintf("the konnector in this cluster (%s, Deployment %s/%s)", versionOf(found.Image), Namespace, KonnectorName)
		case found.Served != nil:
			served = found.Served
			which = fmt.Sprintf("the APIServiceBinding CRD in this cluster (CRD %s, installed by a konnector)", BindingCRDName)
		case kbindV2Note != "":
			f.refused[p] = kbindV2Note + ", and with --skip-konnector there is no kube-bind konnector to serve " + BindingGVR.Group +
				" APIServiceBindings; leave out --skip-konnector to deploy kube-bind's konnector next to it"
			continue
		default:
			f.notes[p] = fmt.Sprintf("no konnector found in this cluster (no Deployment %s/%s, no CRD %s): with --skip-konnector, "+
				"the konnector you run elsewhere must install the CRD serving %s APIServiceBindings; the bind waits for it at most --wait-timeout",
				Namespace, KonnectorName, BindingCRDName, gv)
			continue
		}
		if !slices.Contains(served, gen.bindingGVR.Version) {
			remedy := "leave out --skip-konnector (the bind then deploys " + gen.konnector + ")"
			if p == ProtocolV1alpha2 {
				remedy = "leave out --skip-konnector (the bind then replaces the konnector by " + gen.konnector + "), or upgrade the konnector to v0.5 or newer"
			}
			f.refused[p] = fmt.Sprintf("%s serves only %s APIServiceBindings, and --skip-konnector leaves it as it is: "+
				"a %s bind would wait for a CRD that never comes; %s", which, groupVersions(served), gv, remedy)
		}
	}
	return f
}

var v1alpha1GV = genV1alpha1.groupVersion

func groupVersions(versions []string) string {
	if len(versions) == 0 {
		return "no"
	}
	gvs := make([]string, len(versions))
	for i, v := range versions {
		gvs[i] = BindingGVR.Group + "/" + v
	}
	return strings.Join(gvs, " and ")
}

func isVersion(image string) bool {
	_, err := version.ParseSemantic(tag(image))
	return err == nil
}

// versionOf is image's tag when it is a version, else the image.
func versionOf(image string) string {
	if isVersion(image) {
		return tag(image)
	}
	return image
}

func describeFound(found Found) string {
	var parts []string
	if found.Image != "" {
		parts = append(parts, fmt.Sprintf("konnector %s (Deployment %s/%s)", found.Image, Namespace, KonnectorName))
	}
	if found.Served != nil {
		parts = append(parts, fmt.Sprintf("CRD %s serving %s", BindingCRDName, groupVersions(found.Served)))
	}
	if len(found.KbindV2) > 0 {
		parts = append(parts, "kbind v2's CRDs "+strings.Join(found.KbindV2, ", "))
	}
	if len(parts) == 0 {
		return "no konnector"
	}
	return strings.Join(parts, "; ")
}
