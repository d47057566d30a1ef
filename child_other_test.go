//go:build unix && !linux

package main

import "syscall"

// childProcAttr puts a test's child in a process group of its own when asked.
// Without Linux's parent-death signal a child outlives a test binary that
// dies before its cleanup runs.
func childProcAttr(ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: ownGroup}
}
