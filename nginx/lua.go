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

// jsModule is the njs side of the stream configuration: the PROXY protocol
// filter of UDP ports, which nginx.conf imports (js_import) when one asks for it.
//
//go:embed js/portico.js
var jsModule []byte

// jsModuleFile is jsModule's file name inside the prefix directory.
const jsModuleFile = "portico.js"

// jsDigest identifies jsModule in a configuration that imports it.
var jsDigest = func() string {
	sum := sha256.Sum256(jsModule)
	return hex.EncodeToString(sum[:8])
}()

// writeLuaModule puts luaModule and jsModule into nginx's prefix directory
// (leaving files that are already right alone), where every configuration
// rendered from this binary expects them. nginx -t does not run Lua, and
// compiles the njs module, so both must be there before nginx starts or reloads.
func writeLuaModule(prefix string) error {
	if err := writeFileIfChanged(filepath.Join(prefix, luaModuleFile), luaModule, 0o644); err != nil {
		return fmt.Errorf("write lua module: %w", err)
	}
	if err := writeFileIfChanged(filepath.Join(prefix, jsModuleFile), jsModule, 0o644); err != nil {
		return fmt.Errorf("write njs module: %w", err)
	}
	return nil
}
