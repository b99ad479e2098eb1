package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// file is a configuration read from a file, for `rebound config check
// --env-file`: the variables, in Load's KEY=VALUE form, and what about the
// file's text deserves a warning.
type file struct {
	Environ []string
	Notes   []string
}

// envName is what kustomize and kubectl accept as a variable name in an
// env file.
var envName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// ReadFile reads the variables of data: a dotenv file (the rebound.env a
// configMapGenerator loads) or rendered ConfigMaps in YAML or JSON (the
// output of `kubectl kustomize`, or `kubectl get configmap -o yaml|json`,
// a List's items included), whose data is taken. Which one is told by the
// text: a first character "{" or a line starting "apiVersion:" or "kind:"
// makes it YAML (JSON is YAML).
func ReadFile(data []byte) (file, error) {
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		return readConfigMaps(data)
	}
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "apiVersion:") || strings.HasPrefix(line, "kind:") {
			return readConfigMaps(data)
		}
	}
	return readEnvFile(data)
}

// readEnvFile reads data as kustomize's configMapGenerator (envs:) and
// `kubectl create configmap --from-env-file` read it, since their
// ConfigMap is what the sidecar gets: one KEY=VALUE a line, split at the
// first "=", the value kept verbatim (no shell: "(" is a character like
// any other, a "#" after the value is part of it, and quotes are not
// removed). Blank lines and lines starting with "#" are skipped. A value
// in quotes is read with its quotes, as the sidecar would read it, and
// noted: a shell or docker compose would have removed them.
func readEnvFile(data []byte) (file, error) {
	var f file
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimLeft(sc.Text(), " \t")
		if n == 1 {
			line = strings.TrimPrefix(line, "\uFEFF")
		}
		if line == "" || line[0] == '#' {
			continue
		}
		key, value, _ := strings.Cut(line, "=")
		if !envName.MatchString(key) {
			return file{}, fmt.Errorf("read env file: line %d: %q is not a variable name (KEY=VALUE, no spaces or export)", n, key)
		}
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			f.Notes = append(f.Notes, fmt.Sprintf("line %d: %s's value is in quotes, which kustomize and kubectl keep: rebound reads %s with them", n, key, value))
		}
		if strings.TrimRight(value, " \t") != value {
			f.Notes = append(f.Notes, fmt.Sprintf("line %d: %s's value ends in spaces, which kustomize and kubectl keep", n, key))
		}
		f.Environ = append(f.Environ, key+"="+value)
	}
	if err := sc.Err(); err != nil {
		return file{}, fmt.Errorf("read env file: %w", err)
	}
	return f, nil
}

// manifest is what readConfigMaps reads of a YAML document: a ConfigMap's
// data, or a List's items.
type manifest struct {
	Kind     string                `yaml:"kind"`
	Metadata struct{ Name string } `yaml:"metadata"`
	Data     yaml.Node             `yaml:"data"` // a mapping, read in order
	Items    []manifest            `yaml:"items"`
}

// readConfigMaps reads the data of the ConfigMaps in a YAML stream (or a
// JSON document) that hold REBOUND_ variables, with a YAML library: any
// scalar style, comments, flow mappings. A value that is not a string (5
// unquoted, true) is an error, as the Kubernetes API makes it; so is a
// second ConfigMap that sets a variable the first did otherwise.
func readConfigMaps(data []byte) (file, error) {
	var f file
	seen := map[string]string{}
	found := false
	var take func(m manifest, where string) error
	take = func(m manifest, where string) error {
		for i, item := range m.Items {
			if err := take(item, fmt.Sprintf("%s, item %d", where, i+1)); err != nil {
				return err
			}
		}
		if m.Kind != "ConfigMap" {
			return nil
		}
		if m.Data.Kind == 0 {
			return nil // no data
		}
		if m.Data.Kind != yaml.MappingNode {
			return fmt.Errorf("read ConfigMap %s (%s): data is %s, want a mapping", m.Metadata.Name, where, describeNode(m.Data))
		}
		pairs := m.Data.Content // key, value, key, value...
		hasRebound := false
		for i := 0; i < len(pairs); i += 2 { // the keys; a value may read REBOUND_ too
			hasRebound = hasRebound || strings.HasPrefix(pairs[i].Value, Prefix)
		}
		if !hasRebound {
			return nil
		}
		found = true
		for i := 0; i+1 < len(pairs); i += 2 {
			k, n := pairs[i].Value, *pairs[i+1]
			if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
				return fmt.Errorf("read ConfigMap %s (%s): data %s is %s, not a string: a ConfigMap's data holds strings (quote it)", m.Metadata.Name, where, k, describeNode(n))
			}
			if old, ok := seen[k]; ok && old != n.Value {
				return fmt.Errorf("read ConfigMaps: %s is %q in one and %q in another", k, old, n.Value)
			}
			if _, ok := seen[k]; !ok {
				f.Environ = append(f.Environ, k+"="+n.Value)
			}
			seen[k] = n.Value
		}
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 1; ; i++ {
		var m manifest
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return file{}, fmt.Errorf("read YAML (document %d): %w", i, err)
		}
		if err := take(m, fmt.Sprintf("document %d", i)); err != nil {
			return file{}, err
		}
	}
	if !found {
		return file{}, fmt.Errorf("read ConfigMap: no ConfigMap with %s variables in its data", Prefix)
	}
	return f, nil
}

// describeNode says what a YAML value is, for an error.
func describeNode(n yaml.Node) string {
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return "empty"
	case n.Kind == yaml.ScalarNode:
		return fmt.Sprintf("%s (%s)", n.Value, strings.TrimPrefix(n.ShortTag(), "!!"))
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	}
	return "not a scalar"
}
