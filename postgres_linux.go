package main

import "syscall"

// serverProcAttr runs the server as cred in a process group of its own, so a
// Ctrl-C in the terminal reaches playwatch only, which stops the server last.
// The parent-death signal asks the server for a fast shutdown if playwatch
// dies without stopping it.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGINT}
}
