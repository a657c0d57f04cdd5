package crds

import (
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// consumerWritable lists, per CRD, the top-level fields a consumer's
// credentials may write (docs/binding.md, "Limits per consumer").
var consumerWritable = map[string][]string{
	APIServiceExportRequests: {"spec", "status"},
	APIServiceNamespaces:     {"spec", "status"},
	ClusterBindings:          {"status"},
	APIServiceExports:        {"status"},
	BoundSchemas:             {"status"},
}

// Every field a consumer can write is bounded by the schema: strings by a
// length, an enum or a format; lists by maxItems; maps and free-form
// objects by maxProperties. Together with the object counts of the
// consumer's ResourceQuota this bounds what a consumer stores.
func TestConsumerWritableFieldsBounded(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, crd := range crds {
		fields, ok := consumerWritable[crd.Name]
		if !ok {
			continue
		}
		seen++
		for _, v := range crd.Spec.Versions {
			root := v.Schema.OpenAPIV3Schema
			for _, f := range fields {
				s, ok := root.Properties[f]
				if !ok {
					t.Errorf("%s %s: no %s in the schema", crd.Name, v.Name, f)
					continue
				}
				for _, p := range unbounded(crd.Name+"."+f, &s) {
					t.Errorf("%s %s: unbounded", v.Name, p)
				}
			}
		}
	}
	if seen != len(consumerWritable) {
		t.Fatalf("checked %d CRDs, want %d", seen, len(consumerWritable))
	}
}

func unbounded(path string, s *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	switch {
	case s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields, s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil && s.AdditionalProperties.Schema.XIntOrString:
		if s.MaxProperties == nil || !hasSizeRule(s) {
			out = append(out, path+" (free-form: needs maxProperties and a size rule)")
		}
	case s.Type == "string":
		if s.MaxLength == nil && len(s.Enum) == 0 && s.Format != "date-time" {
			out = append(out, path)
		}
	case s.Type == "array":
		if s.MaxItems == nil {
			out = append(out, path)
		}
		if s.Items != nil && s.Items.Schema != nil {
			out = append(out, unbounded(path+"[]", s.Items.Schema)...)
		}
	case s.Type == "object":
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			if s.MaxProperties == nil {
				out = append(out, path+" (map)")
			}
			out = append(out, unbounded(path+"{}", s.AdditionalProperties.Schema)...)
		}
		for name, p := range s.Properties {
			out = append(out, unbounded(path+"."+name, &p)...)
		}
	}
	return out
}

func hasSizeRule(s *apiextensionsv1.JSONSchemaProps) bool {
	for _, r := range s.XValidations {
		if strings.Contains(r.Rule, "size(") {
			return true
		}
	}
	return false
}
