package config

import (
	"slices"
	"strings"
	"testing"
)

func TestReadFile(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
		notes      int
		err        string
	}{
		{"dotenv with ( and a comment", "# c\n\n  REBOUND_ORIGIN_QUEUES=^(orders|payments)\\.\nREBOUND_MAX_RETRIES=4 # four\n",
			[]string{`REBOUND_ORIGIN_QUEUES=^(orders|payments)\.`, "REBOUND_MAX_RETRIES=4 # four"}, 0, ""},
		{"quotes are kept and noted", "REBOUND_MAX_RETRIES=\"4\"\nREBOUND_LOG_LEVEL='info'\n",
			[]string{`REBOUND_MAX_RETRIES="4"`, "REBOUND_LOG_LEVEL='info'"}, 2, ""},
		{"a value with = in it", "REBOUND_AMQP_URL=amqp://h/?a=b\n", []string{"REBOUND_AMQP_URL=amqp://h/?a=b"}, 0, ""},
		{"export is not kustomize's syntax", "export REBOUND_MAX_RETRIES=4\n", nil, 0, "not a variable name"},
		{"a rendered ConfigMap", "apiVersion: v1\nkind: Secret\ndata:\n  url: eA==\n---\napiVersion: v1\ndata:\n  REBOUND_ORIGIN_QUEUES: ^(orders|payments)\\.\n  REBOUND_MAX_RETRIES: \"12\"\n  REBOUND_LOG_LEVEL: 'info'\nkind: ConfigMap\nmetadata:\n  name: rebound-config\n",
			[]string{`REBOUND_ORIGIN_QUEUES=^(orders|payments)\.`, "REBOUND_MAX_RETRIES=12", "REBOUND_LOG_LEVEL=info"}, 0, ""},
		{"a ConfigMap without rebound", "apiVersion: v1\nkind: ConfigMap\ndata:\n  a: b\n", nil, 0, "no ConfigMap"},
		{"a block scalar, read as the API reads it", "kind: ConfigMap\ndata:\n  REBOUND_X: |\n    y\n", []string{"REBOUND_X=y\n"}, 0, ""},
		// The cases a line reader got wrong (issue 46).
		{"a comment after a quoted value", "kind: ConfigMap\ndata:\n  REBOUND_MAX_RETRIES: \"5\" # five\n", []string{"REBOUND_MAX_RETRIES=5"}, 0, ""},
		{"a flow mapping", "kind: ConfigMap\ndata: {REBOUND_MAX_RETRIES: \"5\", REBOUND_JITTER: none}\n", []string{"REBOUND_MAX_RETRIES=5", "REBOUND_JITTER=none"}, 0, ""},
		{"JSON", `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rebound-config"}, "data": {"REBOUND_MAX_RETRIES": "5"}}`, []string{"REBOUND_MAX_RETRIES=5"}, 0, ""},
		{"a List, as kubectl get -o yaml writes it", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  data:\n    REBOUND_MAX_RETRIES: \"7\"\n", []string{"REBOUND_MAX_RETRIES=7"}, 0, ""},
		{"a number where the API wants a string", "kind: ConfigMap\nmetadata:\n  name: rc\ndata:\n  REBOUND_MAX_RETRIES: 5\n", nil, 0, "data REBOUND_MAX_RETRIES is 5 (int), not a string"},
		{"not YAML", "kind: ConfigMap\ndata: [\n", nil, 0, "read YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ReadFile([]byte(tc.text))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f.Environ, tc.want) || len(f.Notes) != tc.notes {
				t.Errorf("got %q notes %q, want %q and %d notes", f.Environ, f.Notes, tc.want, tc.notes)
			}
		})
	}
}

func FuzzReadFile(f *testing.F) {
	f.Add([]byte("REBOUND_A=b\n"))
	f.Add([]byte("kind: ConfigMap\ndata:\n  REBOUND_A: \"b\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ReadFile(data)
		if err != nil {
			return
		}
		for _, kv := range file.Environ {
			if !strings.Contains(kv, "=") {
				t.Fatalf("%q has no =", kv)
			}
		}
	})
}
