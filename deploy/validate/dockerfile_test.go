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
		{"floating builder", "golang:1.26.8-bookworm@sha256:a688600ca24f8a4d3ca77f95b0dd40704a9fc787c826660eb7ba0b641b8b175d", "golang:1.26", "builder stage"},
		{"builder by minor version", "golang:1.26.8-bookworm@", "golang:1.26-bookworm@", "exact version"},
		{"final unpinned", "nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab\n", "nonroot\n", "by its digest"},
		{"base digest label", `base.digest="sha256:afa5`, `base.digest="sha256:bfa5`, "base.digest"},
		{"licence label", `licenses="Apache-2.0"`, `licenses="MIT"`, "image.licenses"},
		{"version label", `version="$VERSION"`, `version="dev"`, "image.version"},
		{"revision stamp", "buildinfo.revision=$REVISION", "buildinfo.revision=x", "buildinfo.revision=$REVISION"},
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

// TestLicenceLabelIsTheLicence: the image's licenses label names the
// licence in the repository's LICENSE.
func TestLicenceLabelIsTheLicence(t *testing.T) {
	licence := string(read(t, "../../LICENSE"))
	if !strings.Contains(licence, "Apache License") || !strings.Contains(licence, "Version 2.0, January 2004") {
		t.Fatalf("LICENSE is not the Apache License 2.0 the image's label names")
	}
	if !strings.Contains(string(read(t, dockerfile)), `org.opencontainers.image.licenses="Apache-2.0"`) {
		t.Error("the Dockerfile does not label the image Apache-2.0")
	}
}
