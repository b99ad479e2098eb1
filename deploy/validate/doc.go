// Package validate checks rebound's deployment files in deploy/ against the
// real parsers and types that will read them: kustomize and the Kubernetes
// API types for the manifests, Prometheus' rule and PromQL parsers for the
// alerts and the dashboard, and rebound's own config.Load for the
// configuration the manifests carry.
//
// It is its own Go module so that these heavy dependencies never reach
// rebound's go.mod. Run its tests with
//
//	cd deploy/validate && go test ./...
package validate
