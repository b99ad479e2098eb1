package validate

import (
	"fmt"
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

// CheckDockerfile checks the image deploy/Dockerfile describes against the
// manifests: a static build, a distroless nonroot final stage, the user
// the pod's securityContext names, httpPort exposed, and /rebound as the
// entry point.
func CheckDockerfile(content string, httpPort int) []string {
	var problems []string
	ins := ParseDockerfile(content)
	var froms []string
	var build, user, expose, entry string
	for _, in := range ins {
		switch in.Cmd {
		case "FROM":
			froms = append(froms, in.Args)
		case "RUN":
			if strings.Contains(in.Args, "go build") {
				build = in.Args
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
		if !strings.Contains(froms[0], "golang:") {
			problems = append(problems, fmt.Sprintf("builder stage %q is not a golang image", froms[0]))
		}
		if last := froms[len(froms)-1]; last != "gcr.io/distroless/static-debian12:nonroot" {
			problems = append(problems, fmt.Sprintf("final stage %q, want gcr.io/distroless/static-debian12:nonroot", last))
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X github.com/rebound-mq/rebound/internal/buildinfo.version="} {
		if !strings.Contains(build, want) {
			problems = append(problems, fmt.Sprintf("go build step lacks %s", want))
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
