import DataProtection
import DataProtectionSystem
import Foundation

/// What checking a backup found: every object it uses, and which of them are damaged.
public struct BackupVerification: Sendable, Equatable, Codable {
    /// The backup's ID (its directory name).
    public var backup: String
    /// How many objects the backup uses, all checked.
    public var objectsChecked: Int
    /// Whether ``Problem/files`` could be filled in: false before the device's first unlock,
    /// when the sealed manifest that names the files cannot be opened.
    public var filesNamed: Bool
    /// The damaged objects, in the order the backup lists them.
    public var problems: [Problem]

    public var isIntact: Bool { problems.isEmpty }

    /// What is wrong with one object.
    public enum Issue: String, Sendable, Codable {
        case missing
        case notARegularFile = "not a regular file"
        case altered
        /// A chunk list (FORMAT.md §5.2) that does not parse, or names a pack the backup does not list.
        case malformed
    }

    /// One damaged object and the files of the backup whose content it holds.
    public struct Problem: Sendable, Equatable, Codable, CustomStringConvertible {
        /// The object's SHA-256, in hex.
        public var object: String
        public var issue: Issue
        /// The backed-up paths (relative to the backup's source) that restore from it.
        public var files: [String]

        public var description: String {
            let what = "object \(object.prefix(12))… is \(issue.rawValue)"
            guard !files.isEmpty else { return what }
            let names =
                files.prefix(3).map(LosslessPath.display).joined(separator: ", ")
                + (files.count > 3 ? " and \(files.count - 3) more" : "")
            return "\(names): \(what)"
        }
    }
}
