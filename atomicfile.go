package main

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// writeFileAtomic replaces path with data, mode perm, owned by cred when
// given. A reader sees the old file or the new one, never a part; the data
// is synced before the rename, so after a power loss too.
func writeFileAtomic(path string, data []byte, perm os.FileMode, cred *syscall.Credential) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, err = f.Write(data)
	if err = errors.Join(err, f.Chmod(perm), f.Sync(), f.Close()); err != nil {
		return err
	}
	if cred != nil {
		if err := os.Lchown(f.Name(), int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	return os.Rename(f.Name(), path)
}
