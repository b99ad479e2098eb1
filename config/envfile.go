package config

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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
// configMapGenerator loads) or a rendered ConfigMap in YAML (the output of
// `kubectl kustomize`, whose ConfigMap's data is taken). Which one is
// told by the text: a line starting "apiVersion:" or "kind:" makes it
// YAML.
func ReadFile(data []byte) (file, error) {
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

// documentSeparator and configMapKind find the documents of a YAML
// stream and the ConfigMaps among them.
var (
	documentSeparator = regexp.MustCompile(`(?m)^---\s*$`)
	configMapKind     = regexp.MustCompile(`(?m)^kind:\s*ConfigMap\s*$`)
)

// readConfigMaps reads the data of the ConfigMaps in a YAML stream that
// hold REBOUND_ variables. It reads what `kubectl kustomize` writes for
// a ConfigMap's data (one "key: value" a line, the value plain, single-
// or double-quoted), not every YAML: a block scalar (| or >) is an error,
// as is a second ConfigMap that sets a variable the first did otherwise.
func readConfigMaps(data []byte) (file, error) {
	var f file
	seen := map[string]string{}
	found := false
	for i, doc := range documentSeparator.Split(string(data), -1) {
		if !configMapKind.MatchString(doc) {
			continue
		}
		vars, err := configMapData(doc)
		if err != nil {
			return file{}, fmt.Errorf("read ConfigMap (document %d): %w", i+1, err)
		}
		if !hasReboundVariable(vars) {
			continue
		}
		found = true
		for _, kv := range vars {
			if old, ok := seen[kv[0]]; ok && old != kv[1] {
				return file{}, fmt.Errorf("read ConfigMaps: %s is %q in one and %q in another", kv[0], old, kv[1])
			}
			if _, ok := seen[kv[0]]; !ok {
				f.Environ = append(f.Environ, kv[0]+"="+kv[1])
			}
			seen[kv[0]] = kv[1]
		}
	}
	if !found {
		return file{}, fmt.Errorf("read ConfigMap: no ConfigMap with %s variables in its data", Prefix)
	}
	return f, nil
}

func hasReboundVariable(vars [][2]string) bool {
	for _, kv := range vars {
		if strings.HasPrefix(kv[0], Prefix) {
			return true
		}
	}
	return false
}

// configMapData reads the top-level data: mapping of one YAML document.
func configMapData(doc string) ([][2]string, error) {
	var out [][2]string
	in := false
	for line := range strings.Lines(doc) {
		line = strings.TrimRight(line, "\r\n")
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case trimmed == "" || trimmed[0] == '#':
			continue
		case line == trimmed: // a top-level key
			in = strings.TrimSpace(line) == "data:"
			continue
		case !in:
			continue
		}
		key, raw, ok := strings.Cut(trimmed, ":")
		if !ok {
			return nil, fmt.Errorf("data line %q: want key: value", trimmed)
		}
		key, err := yamlScalar(strings.TrimSpace(key))
		if err != nil {
			return nil, fmt.Errorf("data key %q: %w", key, err)
		}
		value, err := yamlScalar(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("data %s: %w", key, err)
		}
		out = append(out, [2]string{key, value})
	}
	return out, nil
}

// yamlScalar reads a one-line YAML scalar as kubectl kustomize writes
// them.
func yamlScalar(s string) (string, error) {
	switch {
	case s == "|" || s == ">" || strings.HasPrefix(s, "|") || strings.HasPrefix(s, ">"):
		return "", fmt.Errorf("block scalar %q: not read here; write the value on one line", s)
	case len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'':
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'"), nil
	case len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"':
		v, err := strconv.Unquote(s)
		if err != nil {
			return "", fmt.Errorf("double-quoted value %s: %w", s, err)
		}
		return v, nil
	}
	if i := strings.Index(s, " #"); i >= 0 {
		s = strings.TrimRight(s[:i], " ")
	}
	return s, nil
}
