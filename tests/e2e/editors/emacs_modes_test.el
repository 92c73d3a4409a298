;;; emacs_modes_test.el --- which major modes diffill-setup hands to diffill  -*- lexical-binding: t; -*-

;; emacs --batch -L editors/emacs -l emacs_modes_test.el -f ert-run-tests-batch-and-exit
;; Issue 27: by default (`diffill-major-modes' = `auto') diffill takes the Python modes and
;; the modes of each other language the server parses for which eglot has no other server
;; that can start (entry missing, or its program not found); a list is used as it is.
;; Programs are "installed" as empty executables in a temporary directory that is the whole
;; `exec-path', so nothing depends on what this machine has.

;;; Code:

(require 'package)
(package-activate-all)
(require 'ert)
(require 'eglot)
(require 'diffill)

(defconst e2e-eglot-programs (copy-tree eglot-server-programs)
  "Eglot's own table, before any test touched it.")

(defmacro e2e-with-programs (programs &rest body)
  "Run BODY with only PROGRAMS (names) on `exec-path' and eglot's own table."
  (declare (indent 1))
  `(let* ((dir (make-temp-file "diffill-bin" t))
          (exec-path (list dir))
          (eglot-server-programs (copy-tree e2e-eglot-programs))
          (diffill-major-modes 'auto))
     (unwind-protect
         (progn
           (dolist (p ,programs)
             (let ((f (expand-file-name p dir)))
               (with-temp-file f (insert "#!/bin/sh\n"))
               (set-file-modes f #o755)))
           ,@body)
       (delete-directory dir t))))

(defun e2e-contact-for (mode)
  "The contact eglot's own lookup finds for MODE."
  (nth 2 (eglot--lookup-mode mode)))

(defun e2e-diffill-p (mode)
  "Non-nil when eglot would start diffill for MODE."
  (let ((contact (e2e-contact-for mode)))
    (and (proper-list-p contact) (memq #'diffill--initialization-options contact) t)))

(defconst e2e-all-modes
  '(python-mode python-ts-mode js-mode js-ts-mode typescript-mode typescript-ts-mode
    tsx-ts-mode go-mode go-ts-mode rust-mode rust-ts-mode java-mode java-ts-mode c-mode
    c-ts-mode c++-mode c++-ts-mode csharp-mode csharp-ts-mode ruby-mode ruby-ts-mode
    php-mode php-ts-mode lua-mode lua-ts-mode sh-mode bash-ts-mode))

(ert-deftest e2e-default-is-auto ()
  (should (eq (eval (car (get 'diffill-major-modes 'standard-value))) 'auto)))

(ert-deftest e2e-no-other-server-every-parsed-language ()
  "Nothing installed: diffill takes every listed language's modes."
  (e2e-with-programs '()
    (should (equal (diffill-default-major-modes) e2e-all-modes))
    (diffill-setup)
    (dolist (mode '(python-mode go-mode typescript-mode js-mode rust-mode c-mode c++-mode
                    java-mode ruby-mode php-mode lua-mode sh-mode))
      (should (e2e-diffill-p mode)))
    ;; a mode derived from a listed one (Emacs 28: js-jsx-mode from js-mode) follows it
    (when (require 'js nil t)            ; loaded, as in a js-jsx-mode buffer
      (should (eq (get 'js-jsx-mode 'derived-mode-parent) 'js-mode))
      (should (e2e-diffill-p 'js-jsx-mode)))
    ;; languages the server does not parse are left alone
    (should-not (e2e-diffill-p 'haskell-mode))))

(ert-deftest e2e-installed-servers-keep-their-modes ()
  "gopls, clangd (an `eglot-alternatives' entry) and pylsp installed."
  (e2e-with-programs '("gopls" "clangd" "pylsp")
    (let ((modes (diffill-default-major-modes)))
      (dolist (m '(go-mode go-ts-mode c-mode c-ts-mode c++-mode c++-ts-mode))
        (should-not (memq m modes)))
      (dolist (m '(python-mode python-ts-mode typescript-mode js-mode rust-mode lua-mode))
        (should (memq m modes))))
    (diffill-setup)
    (should (equal (e2e-contact-for 'go-mode) '("gopls")))
    (should-not (e2e-diffill-p 'c-mode))
    (should (e2e-diffill-p 'typescript-mode))
    (should (e2e-diffill-p 'python-mode))))  ; Python goes to diffill whatever is installed

(ert-deftest e2e-user-entries-count ()
  "An entry of the user's, found on exec-path, keeps its language; one not found does not."
  (e2e-with-programs '("my-lua-ls")
    (push '((lua-mode lua-ts-mode) . ("my-lua-ls" "--stdio")) eglot-server-programs)
    (push '((ruby-mode :language-id "ruby") . ("not-installed-ls")) eglot-server-programs)
    (push '(go-mode . ("localhost" 7000)) eglot-server-programs) ; a server on a port
    (let ((modes (diffill-default-major-modes)))
      (should-not (memq 'lua-mode modes))
      (should-not (memq 'go-mode modes))
      (should (memq 'ruby-mode modes)))))

(ert-deftest e2e-setup-again-decides-again ()
  "One diffill entry after each setup; installing gopls gives Go back at the next one."
  (e2e-with-programs '()
    (diffill-setup)
    (should (e2e-diffill-p 'go-mode))
    (let ((f (expand-file-name "gopls" (car exec-path))))
      (with-temp-file f (insert "#!/bin/sh\n"))
      (set-file-modes f #o755))
    (diffill-setup)
    (should (= 1 (cl-count-if #'diffill--own-entry-p eglot-server-programs)))
    (should (equal (e2e-contact-for 'go-mode) '("gopls")))
    (should (e2e-diffill-p 'typescript-mode))))

(ert-deftest e2e-a-list-is-used-as-it-is ()
  (e2e-with-programs '("gopls")
    (let ((diffill-major-modes '(python-mode go-mode)))
      (diffill-setup)
      (should (equal (car (car eglot-server-programs)) '(python-mode go-mode)))
      (should (e2e-diffill-p 'go-mode))        ; asked for: taken from gopls
      (should-not (e2e-diffill-p 'typescript-mode)))))

;;; emacs_modes_test.el ends here
