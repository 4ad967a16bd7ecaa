// Package sandbox takes a pod stack's privileges away once its setup is
// done: every capability of every thread, new privileges through exec, and
// every system call the serving stack does not make (seccomp-bpf, applied
// to all threads). docs/reliability/sandbox.md says what is kept and why.
package sandbox
