package validate

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rebound-mq/rebound/config"
)

const dockerfile = "../Dockerfile"

// TestDockerfile checks the image against rebound's defaults: EXPOSE is
// the port rebound listens on when REBOUND_HTTP_ADDR is not set.
func TestDockerfile(t *testing.T) {
	def, err := config.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, portText, err := net.SplitHostPort(def.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range CheckDockerfile(string(read(t, dockerfile)), port) {
		t.Error(p)
	}
}

func TestCheckDockerfileCatches(t *testing.T) {
	good := string(read(t, dockerfile))
	tests := []struct{ name, from, to, want string }{
		{"root", "USER 65532:65532", "USER root", "USER"},
		{"cgo", "CGO_ENABLED=0", "CGO_ENABLED=1", "CGO_ENABLED=0"},
		{"port", "EXPOSE 9464", "EXPOSE 8080", "EXPOSE"},
		{"base", "static-debian12:nonroot", "static-debian12", "final stage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := strings.Replace(good, tt.from, tt.to, 1)
			if bad == good {
				t.Fatalf("the Dockerfile has no %q to change", tt.from)
			}
			ps := CheckDockerfile(bad, 9464)
			if !slices.ContainsFunc(ps, func(s string) bool { return strings.Contains(s, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
}
