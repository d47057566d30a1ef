package main

import "syscall"

// childProcAttr makes a test's child process die with the test binary,
// whatever ends it (a panic, a test timeout), optionally in a process group
// of its own.
func childProcAttr(ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: ownGroup, Pdeathsig: syscall.SIGKILL}
}
