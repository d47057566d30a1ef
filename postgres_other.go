//go:build unix && !linux

package main

import "syscall"

// serverProcAttr runs the server as cred in a process group of its own, so a
// Ctrl-C in the terminal reaches playwatch only, which stops the server last.
// macOS and the BSDs have no parent-death signal: a server whose playwatch
// was killed keeps running until the next start on the data directory takes
// it over or stops it (postmaster.pid names it).
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
