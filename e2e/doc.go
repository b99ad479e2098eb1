// Package e2e holds rebound's end-to-end tests: the real program, run
// in-process through internal/cli or as a built binary, against a real
// RabbitMQ (internal/brokertest picks which of the test matrix), with a
// test application that rejects what it is given.
//
// The files: env_test.go is the harness (a test's private deployment,
// rebound in-process or as a process), faults_test.go drives the broker
// (outages, alarms) and accounting_test.go counts every message id at the
// end of a scenario. loop_test.go, parked_test.go, topology_test.go,
// origin_test.go and tls_test.go test behaviour; noloss_test.go drives
// faults and loses nothing. Tests that disturb the whole broker (memory
// alarm, broker restart, cluster) are built with the chaos tag only:
// `make test` runs them in steps of their own.
package e2e
