package validate

import (
	"fmt"
	"regexp"
	"strings"
)

// Instruction is one Dockerfile instruction, continuation lines joined.
type Instruction struct {
	Cmd  string // upper case: FROM, RUN, ...
	Args string
}

// ParseDockerfile splits a Dockerfile into instructions. It knows only
// what deploy/Dockerfile uses: comments, blank lines and backslash
// continuations (no heredocs, no escape directive).
func ParseDockerfile(content string) []Instruction {
	var out []Instruction
	var cur strings.Builder
	for _, line := range strings.Split(content, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") || (t == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(t, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(t)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, Instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// pinned is an image reference with an exact version tag and a digest:
// golang:1.26.8-bookworm@sha256:<64 hex digits>.
var pinned = regexp.MustCompile(`^([a-z0-9./-]+):([A-Za-z0-9._-]+)@sha256:[0-9a-f]{64}$`)

// exactGoTag is a golang image tag naming a patch release.
var exactGoTag = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[a-z0-9]+)?$`)

// labelPair is one key=value of a LABEL instruction.
var labelPair = regexp.MustCompile(`([A-Za-z0-9._-]+)=("(?:[^"\\]|\\.)*"|\S+)`)

// fromImage is the image a FROM instruction's arguments name, without
// --platform and the stage name.
func fromImage(args string) string {
	for _, f := range strings.Fields(args) {
		if !strings.HasPrefix(f, "--") {
			return f
		}
	}
	return ""
}

// CheckDockerfile checks the image deploy/Dockerfile describes against the
// manifests: a static build stamped with the version and revision, base
// images pinned by version and digest (a floating tag builds another image
// tomorrow), a distroless nonroot final stage, the OCI labels, the user
// the pod's securityContext names, httpPort exposed, and /rebound as the
// entry point.
func CheckDockerfile(content string, httpPort int) []string {
	var problems []string
	ins := ParseDockerfile(content)
	var froms []string
	var build, user, expose, entry string
	labels := map[string]string{}
	for _, in := range ins {
		switch in.Cmd {
		case "FROM":
			froms = append(froms, fromImage(in.Args))
		case "RUN":
			if strings.Contains(in.Args, "go build") {
				build = in.Args
			}
		case "LABEL":
			if len(froms) > 0 && len(froms) == countFrom(ins) { // the final stage's
				for _, m := range labelPair.FindAllStringSubmatch(in.Args, -1) {
					labels[m[1]] = strings.Trim(m[2], `"`)
				}
			}
		case "USER":
			user = in.Args
		case "EXPOSE":
			expose = in.Args
		case "ENTRYPOINT":
			entry = in.Args
		}
	}
	if len(froms) < 2 {
		problems = append(problems, "want a multi-stage build (a builder and a final stage)")
	} else {
		builder, final := pinned.FindStringSubmatch(froms[0]), pinned.FindStringSubmatch(froms[len(froms)-1])
		switch {
		case builder == nil:
			problems = append(problems, fmt.Sprintf("builder stage %q: pin an exact golang version and its digest (golang:1.26.8-bookworm@sha256:...)", froms[0]))
		case builder[1] != "golang" || !exactGoTag.MatchString(builder[2]):
			problems = append(problems, fmt.Sprintf("builder stage %q is not a golang image of an exact version", froms[0]))
		}
		switch {
		case final == nil:
			problems = append(problems, fmt.Sprintf("final stage %q: pin gcr.io/distroless/static-debian12:nonroot by its digest", froms[len(froms)-1]))
		case final[1]+":"+final[2] != "gcr.io/distroless/static-debian12:nonroot":
			problems = append(problems, fmt.Sprintf("final stage %q, want gcr.io/distroless/static-debian12:nonroot", froms[len(froms)-1]))
		default:
			_, digest, _ := strings.Cut(froms[len(froms)-1], "@")
			if got := labels["org.opencontainers.image.base.digest"]; got != digest {
				problems = append(problems, fmt.Sprintf("label org.opencontainers.image.base.digest %q, want the final stage's %s", got, digest))
			}
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w",
		"-X github.com/rebound-mq/rebound/internal/buildinfo.version=$VERSION",
		"-X github.com/rebound-mq/rebound/internal/buildinfo.revision=$REVISION"} {
		if !strings.Contains(build, want) {
			problems = append(problems, fmt.Sprintf("go build step lacks %s", want))
		}
	}
	for key, want := range map[string]string{
		"org.opencontainers.image.title":    "rebound",
		"org.opencontainers.image.source":   "https://github.com/rebound-mq/rebound",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  "$VERSION",
		"org.opencontainers.image.revision": "$REVISION",
	} {
		if got, ok := labels[key]; !ok || got != want {
			problems = append(problems, fmt.Sprintf("final stage label %s = %q, want %q", key, got, want))
		}
	}
	if want := fmt.Sprintf("%d:%d", ImageUID, ImageUID); user != want {
		problems = append(problems, fmt.Sprintf("USER %q, want %s (numeric, as the pod's runAsUser)", user, want))
	}
	if want := fmt.Sprint(httpPort); expose != want {
		problems = append(problems, fmt.Sprintf("EXPOSE %q, want %s (REBOUND_HTTP_ADDR's default)", expose, want))
	}
	if entry != `["/rebound"]` {
		problems = append(problems, fmt.Sprintf(`ENTRYPOINT %s, want ["/rebound"]`, entry))
	}
	return problems
}

func countFrom(ins []Instruction) int {
	n := 0
	for _, in := range ins {
		if in.Cmd == "FROM" {
			n++
		}
	}
	return n
}
