import ArgumentParser
import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging

@main
struct DPCtl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dpctl",
        abstract: "iOS-style Data Protection for files on Linux.",
        discussion: """
            A data root holds the device: a device secret and a keybag with one key per protection \
            class. Every run starts "before first unlock", as a phone does after a reboot; pass \
            --passcode-file to unlock for that run. Classes: complete (A), complete-unless-open (B), \
            until-first-unlock (C, the default), none (D).

            \(ExitStatus.summary)
            """,
        version: DataProtectionVersion.string,
        subcommands: [
            Tour.self, Init.self, Status.self, Unlock.self, Lock.self, Write.self, Cat.self, List.self, Protect.self,
            Copy.self,
            SetPasscode.self, ChangePasscode.self, RemovePasscode.self, Policy.self, Erase.self, TPM.self,
            Exclude.self, Include.self, Exclusions.self, BackupPassword.self, Backup.self, Restore.self, Verify.self,
            Backups.self,
            Forget.self, Prune.self,
            SQL.self, SQLKey.self, Daemon.self, App.self, Group.self, Defaults.self, Share.self, GrantCommand.self,
            Grants.self, Revoke.self,
            Audit.self, Mount.self, Unmount.self,
        ]
    )

    /// Parses `dpctl [--root DIR] [--verbose] SUBCOMMAND …`: options given before the
    /// subcommand are moved after it, where the subcommand's parser expects them.
    static func main() async {
        // A write beyond RLIMIT_FSIZE must fail with EFBIG (a clean error), not kill us.
        signal(SIGXFSZ, SIG_IGN)
        // Every dpctl may hold class keys (a passcode unlocks a keybag of its own) or plaintext
        // (a mount, the apps' file system server, a supervisor, the sharing broker): no other
        // process of the user reads its memory, and it never dumps a core.
        ProcessHygiene.keepMemoryPrivate()
        // Arguments are bytes: read them from argv as such (LosslessPath), so `dpctl write $'y\xfe'`
        // and `$'y\xfd'` name two files, not one `y\u{FFFD}`.
        let raw = (1..<Int(CommandLine.argc)).map { index in
            LosslessPath.string(
                fromBytes: UnsafeBufferPointer(
                    start: UnsafeRawPointer(CommandLine.unsafeArgv[index]!).assumingMemoryBound(to: UInt8.self),
                    count: strlen(CommandLine.unsafeArgv[index]!)))
        }
        let arguments = hoistingGlobalOptions(raw)
        // The file system servers carry plaintext through buffers they free: glibc overwrites
        // every freed block in them (a re-execution with its tunables, once).
        if arguments.first == "mount" || arguments.starts(with: ["app", "serve-file-system"]) {
            HeapHygiene.reexecIfNeeded()
        }
        if let message = CommandSuggestion.message(for: arguments, root: Self.self) {
            FileHandle.standardError.write(Data("dpctl: \(message)\n".utf8))
            Foundation.exit(ExitStatus.usage.rawValue)
        }
        var command: any ParsableCommand
        do {
            command = try parseAsRoot(arguments)
        } catch {
            // Help and usage errors: swift-argument-parser's words; a usage error exits 64 (EX_USAGE).
            exit(withError: error)
        }
        do {
            if var asyncCommand = command as? AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as ExitCode {
            exit(withError: error)
        } catch let error as CleanExit {
            exit(withError: error)
        } catch  where exitCode(for: error) == .success {
            // `dpctl --help` and `dpctl help …` arrive here: the parser returns its help command,
            // whose run throws the request for help. swift-argument-parser prints it.
            exit(withError: error)
        } catch {
            // The one error-reporting point of every command.
            Foundation.exit(report(error).rawValue)
        }
    }

    /// Commands whose work is done by a subcommand (`app`, `share`…), from the command tree.
    static let groups = Set(
        configuration.subcommands.filter { !$0.configuration.subcommands.isEmpty }.compactMap {
            $0.configuration.commandName
        })

    static func hoistingGlobalOptions(_ arguments: [String]) -> [String] {
        var global: [String] = []
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--root", index + 1 < arguments.count {
                global += [argument, arguments[index + 1]]
                index += 2
            } else if argument.hasPrefix("--root=") || argument == "--verbose" || argument == "-v" {
                global.append(argument)
                index += 1
            } else {
                break
            }
        }
        guard !global.isEmpty, index < arguments.count else { return arguments }
        // `dpctl --root DIR help app`, `dpctl --root DIR --generate-completion-script zsh`:
        // help, the version and completion scripts take no root; left in place, the root would
        // split `--generate-completion-script` from its shell.
        if arguments[index] == "help" || arguments[index].hasPrefix("-") { return Array(arguments[index...]) }
        // A command group (`daemon install`) takes them after its subcommand.
        let path = groups.contains(arguments[index]) && index + 1 < arguments.count ? 2 : 1
        return Array(arguments[index..<index + path]) + global + arguments[(index + path)...]
    }
}
