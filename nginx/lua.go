package nginx

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"path/filepath"
)

// luaModule is the Lua side of the configuration (route, balance, control and the
// endpoint table), which nginx.conf loads with require "portico" from nginx's
// prefix directory.
//
//go:embed lua/portico.lua
var luaModule []byte

// luaModuleFile is luaModule's file name inside the prefix directory, beside
// nginx.conf.
const luaModuleFile = "portico.lua"

// luaDigest identifies luaModule in the rendered configuration, so that a changed
// module changes the configuration's text and checksum too.
var luaDigest = func() string {
	sum := sha256.Sum256(luaModule)
	return hex.EncodeToString(sum[:8])
}()

// writeLuaModule puts luaModule into nginx's prefix directory (leaving a file that
// is already right alone), where every configuration rendered from this binary
// expects it. nginx -t does not run Lua, so it must be there before nginx starts
// or reloads.
func writeLuaModule(prefix string) error {
	if err := writeFileIfChanged(filepath.Join(prefix, luaModuleFile), luaModule, 0o644); err != nil {
		return fmt.Errorf("write lua module: %w", err)
	}
	return nil
}
