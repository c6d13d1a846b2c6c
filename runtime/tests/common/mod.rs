pub mod agreement;
