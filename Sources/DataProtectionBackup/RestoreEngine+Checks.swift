import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// The checks a manifest passes before anything is written: names, parents, links that stay inside
/// the tree.
extension RestoreEngine {
    /// The whole tree, before anything is written: plain relative names, a directory entry for
    /// every parent, objects listed. Returns the links that do not stay inside when resolved
    /// (following the backup's other links), which the restore leaves out.
    @discardableResult
    static func checkTree(_ entries: [ManifestEntry], objects: Set<String>) throws -> Set<[UInt8]> {
        // Names are keyed and split by their bytes, as the file system does: NFC `é` and NFD
        // `e\u{301}` are two files, and `/\u{301}` is a separator followed by a name.
        var kinds: [[UInt8]: ManifestEntry.Kind] = [:]
        var links: [(path: String, target: String)] = []
        for entry in entries {
            try checkName(entry.path)
            // One entry per name (the manifest's table has the name as its key; checked again
            // here): a link and a directory of the same name would be judged by one and
            // resolved through the other.
            guard kinds.updateValue(entry.kind, forKey: LosslessPath.key(entry.path)) == nil else {
                throw BackupError.badBackup(
                    path: "manifest", reason: "\(LosslessPath.display(entry.path)) is listed twice")
            }
            if entry.kind == .symlink { links.append((entry.path, entry.linkTarget ?? "")) }
            if let sha = entry.sha256, !objects.contains(sha) {
                throw BackupError.badBackup(
                    path: "manifest",
                    reason: "\(LosslessPath.display(entry.path)) uses an object its object list does not name")
            }
        }
        for entry in entries {
            let parts = LosslessPath.components(of: entry.path)
            for depth in 1..<max(parts.count, 1) {
                guard kinds[LosslessPath.key(parts[0..<depth].joined(separator: "/"))] == .directory else {
                    throw BackupError.unsafePath(LosslessPath.display(entry.path))
                }
            }
        }
        var byBytes: [[UInt8]: String] = [:]
        for link in links { byBytes[LosslessPath.key(link.path)] = link.target }
        return Set(
            links.filter { !resolvesInside(link: $0.path, target: $0.target, linksByBytes: byBytes) }.map {
                LosslessPath.key($0.path)
            })
    }

    /// A manifest name must be relative and plain: no empty, `.` or `..` component, no NUL.
    static func checkName(_ name: String) throws {
        let parts = LosslessPath.components(of: name, omittingEmpty: false)
        guard !name.isEmpty, !LosslessPath.isAbsolute(name), !LosslessPath.bytes(of: name).contains(0),
            parts.allSatisfy({ !$0.isEmpty && !LosslessPath.isDotOrDotDot($0) })
        else {
            throw BackupError.unsafePath(LosslessPath.display(name))
        }
    }

    /// Every parent of `name` inside `root` must be a real directory (never a link).
    static func checkParents(of name: String, in root: String) throws {
        var current = root
        for part in LosslessPath.components(of: name).dropLast() {
            current += "/" + part
            guard let st = POSIXFile.linkStatus(current), st.st_mode & S_IFMT == S_IFDIR else {
                throw BackupError.unsafePath(LosslessPath.display(name))
            }
        }
    }

    /// Whether the link at `link` (relative to the tree) pointing to `target` resolves inside
    /// the tree, following the tree's other links (`links`, path → target) the way the kernel
    /// would, with its limit of 40 hops. Counting `..` alone is not enough: with
    /// `a/b/hop -> ../..` and `evil -> a/b/hop/../../../etc`, `evil` leaves the tree.
    static func resolvesInside(link: String, target: String, links: [String: String]) -> Bool {
        var byBytes: [[UInt8]: String] = [:]
        for (path, target) in links { byBytes[LosslessPath.key(path)] = target }
        return resolvesInside(link: link, target: target, linksByBytes: byBytes)
    }

    static func resolvesInside(link: String, target: String, linksByBytes links: [[UInt8]: String]) -> Bool {
        var stack = LosslessPath.components(of: link).dropLast().map { $0 }
        var pending = ArraySlice(LosslessPath.components(of: target))
        guard !LosslessPath.isAbsolute(target) else { return false }
        var hops = 0
        while let part = pending.popFirst() {
            if Array(part.unicodeScalars) == ["."] { continue }
            if Array(part.unicodeScalars) == [".", "."] {
                guard !stack.isEmpty else { return false }
                stack.removeLast()
                continue
            }
            stack.append(part)
            if let next = links[LosslessPath.key(stack.joined(separator: "/"))] {
                hops += 1
                guard hops <= 40, !LosslessPath.isAbsolute(next) else { return false }
                stack.removeLast()
                pending = ArraySlice(LosslessPath.components(of: next)) + pending
            }
        }
        return true
    }
}
