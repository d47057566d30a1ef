package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// serverProcAttr runs the server as cred in a process group of its own, so a
// Ctrl-C in the terminal reaches playwatch only, which stops the server last.
// The parent-death signal asks the server for a fast shutdown if playwatch
// dies without stopping it.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGINT}
}

// isPostmasterOf reports whether pid is a live postgres whose command line
// names dataDir.
func isPostmasterOf(pid int, dataDir string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(cmdline), "\x00")
	if len(args) == 0 || filepath.Base(args[0]) != "postgres" {
		return false
	}
	for i := range args[:len(args)-1] {
		if args[i] == "-D" && args[i+1] == dataDir {
			return true
		}
	}
	return false
}
