package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
	"sigs.k8s.io/yaml/kyaml"
)

// printer prints objects as kubectl's -o json, yaml and kyaml do.
type printer struct {
	format            string
	showManagedFields bool
}

func newPrinter(format string, showManagedFields bool) (*printer, error) {
	// kubectl offers kyaml unless KUBECTL_KYAML=false.
	kyamlOn := strings.ToLower(os.Getenv("KUBECTL_KYAML")) != "false"
	switch {
	case format == "json", format == "yaml", format == "kyaml" && kyamlOn:
		return &printer{format: format, showManagedFields: showManagedFields}, nil
	case kyamlOn:
		return nil, fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json,kyaml,yaml", format)
	}
	return nil, fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json,yaml", format)
}

// printList prints items as a v1 List, the shape kubectl prints several
// objects in.
func (p *printer) printList(w io.Writer, items []unstructured.Unstructured) error {
	l := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List"}, Items: items}
	if !p.showManagedFields {
		l = l.DeepCopy()
		for i := range l.Items {
			l.Items[i].SetManagedFields(nil)
		}
	}
	data, err := l.MarshalJSON()
	if err != nil {
		return err
	}
	return p.printJSON(w, data)
}

// printJSON prints a JSON document, indented or as YAML.
func (p *printer) printJSON(w io.Writer, data []byte) error {
	switch p.format {
	case "yaml":
		out, err := yaml.JSONToYAML(data)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	case "kyaml":
		var enc kyaml.Encoder
		return enc.FromYAML(bytes.NewReader(data), w)
	}
	var buf bytes.Buffer
	// Indent keeps trailing newlines; the output ends in exactly one.
	if err := json.Indent(&buf, bytes.TrimRight(data, "\n"), "", "    "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := buf.WriteTo(w)
	return err
}
