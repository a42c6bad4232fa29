import DataProtectionTestSupport
import Foundation
import Testing

/// `dpctl sql` and `dpctl sql-key`, as a user runs them.
@Suite struct SQLCommandTests {
    @Test func classManagedSQLCipherAndPlainDatabases() throws {
        let cli = CLI.make()
        let passcode = cli.file("pc")
        try "1234\n".write(toFile: passcode, atomically: true, encoding: .utf8)
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)

        // Class-managed: created with --class, found by its key file afterwards.
        let notes = cli.file("notes.db")
        let made = try cli.run(["sql", notes, "--class", "A", "--passcode-file", passcode,
                                "CREATE TABLE note(id INTEGER PRIMARY KEY, t TEXT, r REAL); INSERT INTO note(t, r) VALUES ('hi', 1), (NULL, 0.5), ('a\tb', 1e20); SELECT * FROM note"])
        #expect(made.status == 0, "\(made.stderr)")
        #expect(made.out == "1\thi\t1.0\n2\t\t0.5\n3\ta\tb\t1.0e+20\n")
        let locked = try cli.run(["sql", notes, "SELECT count(*) FROM note"])
        #expect(locked.status == 3)
        #expect(locked.stderr.hasPrefix("dpctl: \(notes): class A"), "\(locked.stderr)")
        #expect(try cli.run(["sql-key", notes]).status == 3)
        let key = try cli.run(["sql-key", notes, "--passcode-file", passcode]).out.trimmingCharacters(in: .newlines)
        #expect(key.count == 64)
        // The raw key opens it as an SQLCipher database.
        #expect(try cli.run(["sql", notes, "--raw-key-hex", key, "SELECT count(*) FROM note"]).out == "3\n")

        // SQLCipher with a passphrase, both formats; a wrong passphrase exits 5.
        let phrase = cli.file("phrase")
        try "open sesame\n".write(toFile: phrase, atomically: true, encoding: .utf8)
        for compat in ["3", "4"] {
            let db = cli.file("p\(compat).db")
            #expect(try cli.run(["sql", db, "--passphrase-file", phrase, "--cipher-compat", compat, "CREATE TABLE t(x); INSERT INTO t VALUES (7)"]).status == 0)
            #expect(try cli.run(["sql", db, "--passphrase-file", phrase, "--cipher-compat", compat, "SELECT x FROM t"]).out == "7\n")
            let wrong = try cli.run(["sql", db, "--passphrase-file", passcode, "--cipher-compat", compat, "SELECT x FROM t"])
            #expect(wrong.status == 5)
            #expect(wrong.stderr.contains("wrong key"))
        }

        // Plain SQLite without any key; SQL errors are one line.
        let plain = cli.file("plain.db")
        #expect(try cli.run(["sql", plain, "CREATE TABLE t(x); INSERT INTO t VALUES (42); SELECT x FROM t"]).out == "42\n")
        let error = try cli.run(["sql", plain, "SELECT * FROM nope"])
        #expect(error.status == 1)
        #expect(error.stderr.contains("no such table: nope"))
        #expect(try cli.run(["sql", plain, "--class", "A", "--raw-key-hex", key, "SELECT 1"]).status != 0)
    }
}
